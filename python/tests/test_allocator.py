"""vramfit.allocator without CUDA: message recognition, counters, and the
wiring into PyTorch against the real library with a stand-in torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from vramfit import allocator

BUDGET_MESSAGE = (
    "CUDA out of memory: vramfit budget exceeded on GPU 0. Tried to allocate 20.00 MiB with a budget "
    "of 4.00 GiB: 3.90 GiB is allocated by PyTorch and 3.99 GiB is reserved"
)
PACKAGE_ROOT = Path(allocator.__file__).resolve().parent.parent
# Read at collection: the autouse fixture clears every VRAMFIT_* variable
# before each test runs.
EXPLICIT_LIBRARY = os.environ.get(allocator.LIBRARY_ENV)
REQUIRE_LIBRARY = os.environ.get("VRAMFIT_REQUIRE_ALLOCATOR_LIB") == "1"


def library() -> Path:
    """The built library: $VRAMFIT_ALLOCATOR_LIB, else the debug build."""
    candidates = [Path(EXPLICIT_LIBRARY)] if EXPLICIT_LIBRARY else []
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/vramfit/target"))
    candidates.append(Path(target) / "debug" / allocator.LIBRARY_NAME)
    for path in candidates:
        if path.is_file():
            return path
    if REQUIRE_LIBRARY:
        pytest.fail(f"{allocator.LIBRARY_NAME} not built (cargo build -p vramfit-alloc)")
    pytest.skip(f"{allocator.LIBRARY_NAME} not built")


def test_budget_errors_are_recognised_also_when_wrapped() -> None:
    assert allocator.is_budget_oom(RuntimeError(BUDGET_MESSAGE))
    try:
        try:
            raise MemoryError(BUDGET_MESSAGE)
        except MemoryError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        assert allocator.is_budget_oom(outer)
    plain = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 80.00 GiB"
    assert not allocator.is_budget_oom(RuntimeError(plain))
    assert not allocator.is_budget_oom(ValueError("budget"))


def test_counters_flatten_like_torch_memory_stats() -> None:
    nested = {
        "allocated_bytes": {"all": {"current": 5, "peak": 7}, "small_pool": {"current": 1}},
        "num_ooms": 2,
    }
    assert allocator.flatten(nested) == {
        "allocated_bytes.all.current": 5,
        "allocated_bytes.all.peak": 7,
        "allocated_bytes.small_pool.current": 1,
        "num_ooms": 2,
    }
    assert list(allocator.flatten(nested)) == sorted(allocator.flatten(nested))


def test_library_is_found_through_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / allocator.LIBRARY_NAME
    lib.write_bytes(b"")
    monkeypatch.setenv(allocator.LIBRARY_ENV, str(lib))
    assert allocator.find_library() == lib
    monkeypatch.setenv(allocator.LIBRARY_ENV, str(tmp_path / "missing.so"))
    assert allocator.find_library() is None


def test_install_without_torch_says_so_and_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.warns(RuntimeWarning, match="torch is not importable"):
        assert allocator.install(1 << 30) is False
    assert not allocator.installed()
    with pytest.raises(ValueError):
        allocator.install(-1)


def test_install_from_env_honours_the_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(allocator, "install", lambda budget: calls.append(budget) or True)
    assert allocator.install_from_env({"VRAMFIT_BUDGET_BYTES": "1024", "VRAMFIT_ALLOCATOR": "0"}) is False
    assert allocator.install_from_env({}) is False
    assert allocator.install_from_env({"VRAMFIT_BUDGET_BYTES": "1024"}) is True
    assert calls == [1024]
    with pytest.raises(ValueError, match="VRAMFIT_BUDGET_BYTES"):
        allocator.install_from_env({"VRAMFIT_BUDGET_BYTES": "4G"})



def test_install_from_env_leaves_the_context_its_part_of_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    monkeypatch.setattr(allocator, "install", lambda budget: calls.append(budget) or True)
    env = {"VRAMFIT_BUDGET_BYTES": str(10 << 30), "VRAMFIT_CONTEXT_BYTES": str(758 << 20)}
    assert allocator.install_from_env(env) is True
    assert calls == [(10 << 30) - (758 << 20)]
    with pytest.raises(ValueError, match="leaves nothing"):
        allocator.install_from_env({"VRAMFIT_BUDGET_BYTES": "1024", "VRAMFIT_CONTEXT_BYTES": "1024"})
    with pytest.raises(ValueError, match="VRAMFIT_CONTEXT_BYTES"):
        allocator.install_from_env({"VRAMFIT_BUDGET_BYTES": "1024", "VRAMFIT_CONTEXT_BYTES": "1M"})

FAKE_TORCH = '''
"""Stands in for torch: records what vramfit.allocator asks of it."""
import ctypes
import types

class _Hooks:
    def __init__(self):
        self.set = {}
    def __getattr__(self, name):
        if name.startswith("set_"):
            return lambda address: self.set.__setitem__(name[4:], address)
        raise AttributeError(name)

class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn, free_fn):
        lib = ctypes.CDLL(path)
        self.alloc = ctypes.cast(getattr(lib, alloc_fn), ctypes.c_void_p).value
        self.free = ctypes.cast(getattr(lib, free_fn), ctypes.c_void_p).value
        self._allocator = _Hooks()

changed = []

def _raises(name):
    def f(*args):
        raise RuntimeError(f"CUDAPluggableAllocator does not yet support {name}")
    return f

class CUDAGraph:
    def capture_begin(self, *args, **kwargs):
        pass

memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                               change_current_allocator=changed.append)
cuda = types.SimpleNamespace(memory=memory, is_initialized=lambda: False,
                             current_device=lambda: 0, CUDAGraph=CUDAGraph)
_C = types.SimpleNamespace(_cuda_memoryStats=_raises("getDeviceStats"),
                           _cuda_resetPeakMemoryStats=_raises("resetPeakStats"),
                           _cuda_resetAccumulatedMemoryStats=_raises("resetAccumulatedStats"))
'''

WIRING_CHECK = '''
import ctypes, json, sys
import torch
from vramfit import allocator

lib_path = sys.argv[1]
assert allocator.install(4 << 30, policy="vramfit") is True
assert allocator.installed() and allocator.install(1) is True
lib = ctypes.CDLL(lib_path)
address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
[chosen] = torch.changed
assert chosen.alloc == address("vramfit_alloc") and chosen.free == address("vramfit_free")
assert chosen._allocator.set == {
    "init_fn": address("vramfit_init"),
    "reset_fn": address("vramfit_empty_cache"),
    "memory_fraction_fn": address("vramfit_memory_fraction"),
    "record_stream_fn": address("vramfit_record_stream"),
    "begin_allocate_to_pool": address("vramfit_begin_allocate_to_pool"),
}, chosen._allocator.set
# The statistics PyTorch cannot give under a pluggable allocator come from
# the library: nothing allocated on GPU 0 yet.
assert torch._C._cuda_memoryStats(0) == {}
torch._C._cuda_resetPeakMemoryStats(0)
torch._C._cuda_resetAccumulatedMemoryStats(0)
stats = allocator.memory_stats(0)
assert stats["vramfit.policy"] == "vramfit" and stats["vramfit.budgetBytes"] == 4 << 30, stats
assert stats["vramfit.inUse"] is False
try:
    torch.cuda.CUDAGraph().capture_begin()
except RuntimeError as exc:
    assert "CUDA graph capture is not supported" in str(exc)
else:
    raise AssertionError("capture_begin did not refuse")
# The library is configured once: a second configuration is refused.
lib.vramfit_alloc_configure.argtypes = (ctypes.c_uint64, ctypes.c_char_p)
assert lib.vramfit_alloc_configure(1, None) == -1
print("wired")
'''


def test_install_wires_the_library_into_pytorch(tmp_path: Path) -> None:
    lib = library()
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(PACKAGE_ROOT)]),
        VRAMFIT_ALLOCATOR_LIB=str(lib),
    )
    out = subprocess.run(
        [sys.executable, "-c", WIRING_CHECK, str(lib)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "wired"


HARNESS = r'''
// Catches what the library throws the way PyTorch's bindings do: by the
// name python_error, reading type/value, with the GIL released around the call.
#include <Python.h>
#include <dlfcn.h>
#include <cstdio>
#include <exception>
#include <string>
struct python_error : public std::exception {
  PyObject* type; PyObject* value; PyObject* traceback; std::string message;
  const char* what() const noexcept override { return message.c_str(); }
};
int main(int argc, char** argv) {
  Py_Initialize();
  void* so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!so) { std::printf("dlopen: %s\n", dlerror()); return 1; }
  auto alloc = (void* (*)(size_t, int, void*))dlsym(so, "vramfit_alloc");
  auto begin = (void (*)(int, unsigned long long, unsigned long long, void*))dlsym(so, "vramfit_begin_allocate_to_pool");
  PyThreadState* ts = PyEval_SaveThread();
  for (int i = 0; i < 2; i++) {
    try {
      if (i == 0) alloc(1 << 20, 0, nullptr); else begin(0, 1, 2, nullptr);
      std::printf("returned\n");
    } catch (python_error& e) {
      PyGILState_STATE g = PyGILState_Ensure();
      PyObject* s = PyObject_Str(e.value);
      std::printf("%s: %s\n", ((PyTypeObject*)e.type)->tp_name, PyUnicode_AsUTF8(s));
      Py_DECREF(s);
      PyGILState_Release(g);
    } catch (std::exception& e) {
      std::printf("other: %s\n", e.what());
    }
  }
  PyEval_RestoreThread(ts);
  return 0;
}
'''


def test_refusals_reach_python_as_exceptions_through_the_python_error_protocol(tmp_path: Path) -> None:
    lib = library()
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    include = sysconfig.get_paths()["include"]
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    source = tmp_path / "harness.cpp"
    source.write_text(HARNESS)
    binary = tmp_path / "harness"
    subprocess.run(
        [compiler, str(source), "-o", str(binary), f"-I{include}", f"-L{libdir}", f"-lpython{version}",
         "-ldl", "-rdynamic", f"-Wl,-rpath,{libdir}"],
        check=True, capture_output=True, timeout=120,
    )
    # No GPU driver is loadable here (or the test forces that): the
    # allocation is refused and the refusal must arrive as a Python
    # exception object, not as a crash.
    env = dict(os.environ, LD_LIBRARY_PATH="/nonexistent")
    out = subprocess.run([str(binary), str(lib)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first.startswith("RuntimeError: vramfit allocator: cannot use GPU 0"), first
    assert second.startswith("RuntimeError: vramfit allocator: CUDA graph capture"), second
