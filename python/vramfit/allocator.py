"""vramfit's caching allocator as PyTorch's CUDA allocator, with a hard budget.

``install(budget_bytes)`` loads ``libvramfit_alloc.so`` (from
``VRAMFIT_ALLOCATOR_LIB``, else the copy inside the package that the wheel
ships, else one beside the package; see :func:`find_library`) and makes it
PyTorch's allocator through ``torch.cuda.memory.CUDAPluggableAllocator``. From then on
an allocation that would take the process over the budget on a GPU, after
every cached block that could be released was released, raises
``torch.OutOfMemoryError`` whose message names the budget, the allocated and
reserved bytes, the request and the largest free block
(:func:`is_budget_oom` recognises it).

PyTorch 2.11's pluggable allocators do not answer ``torch.cuda.memory_stats``
and the functions built on it (``memory_allocated``, ``max_memory_reserved``,
``memory_summary``, ``reset_peak_memory_stats``...): they raise
"CUDAPluggableAllocator does not yet support getDeviceStats". ``install``
routes them to the library's counters, so training code that logs memory keeps
working. See docs/allocator.md for what is counted.

Not supported, and said so when tried: CUDA graph capture (including
``torch.compile(mode="reduce-overhead")``) and ``torch.cuda.MemPool``.

Nothing here imports torch until ``install`` is called.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = [
    "LIBRARY_ENV",
    "LIBRARY_NAME",
    "BUDGET_MARKER",
    "find_library",
    "install",
    "packaged_library",
    "install_from_env",
    "installed",
    "is_budget_oom",
    "memory_stats",
]

LIBRARY_ENV = "VRAMFIT_ALLOCATOR_LIB"
LIBRARY_NAME = "libvramfit_alloc.so"
#: Every budget failure's message contains this.
BUDGET_MARKER = "vramfit budget exceeded"
#: Set to 0/false/off to keep PyTorch's own allocator (``install_from_env``).
OPT_OUT_ENV = "VRAMFIT_ALLOCATOR"

_lock = threading.Lock()
_installed: Optional["_Installed"] = None
_last_error: Optional[str] = None


class _Installed:
    def __init__(self, lib: ctypes.CDLL, path: Path, budget: int, policy: str, pid: int):
        self.lib = lib
        self.path = path
        self.budget = budget
        self.policy = policy
        self.pid = pid
        # Kept alive: PyTorch holds raw pointers into the library.
        self.allocator: Any = None

    def stats_json(self, device: int, kind: int) -> Optional[dict]:
        if os.getpid() != self.pid:
            return None
        size = 16384
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.vramfit_alloc_stats_json(device, kind, buf, size)
            if n < 0:
                return None
            if n < size:
                return json.loads(buf.value.decode())
            size = n + 1


def packaged_library() -> Optional[Path]:
    """The ``libvramfit_alloc.so`` inside this package (``vramfit/``), where
    the wheel puts it; ``None`` when the package has none (a source checkout,
    or a wheel built with ``VRAMFIT_BUILD_ALLOCATOR=0``)."""
    path = Path(__file__).resolve().parent / LIBRARY_NAME
    return path if path.is_file() else None


def find_library() -> Optional[Path]:
    """Where ``libvramfit_alloc.so`` is: ``$VRAMFIT_ALLOCATOR_LIB`` when set
    (``None`` if that file does not exist: the variable is not ignored), else
    the package's own (:func:`packaged_library`), else one beside the
    package; ``None`` if nowhere (``configure`` then falls back to the memory
    fraction)."""
    explicit = os.environ.get(LIBRARY_ENV, "").strip()
    if explicit:
        path = Path(explicit)
        return path if path.is_file() else None
    packaged = packaged_library()
    if packaged is not None:
        return packaged
    beside = Path(__file__).resolve().parent.parent / LIBRARY_NAME
    return beside if beside.is_file() else None


def last_error() -> Optional[str]:
    """Why the last ``install`` returned False."""
    return _last_error


def _fail(reason: str) -> bool:
    global _last_error
    _last_error = reason
    import warnings

    warnings.warn(f"vramfit allocator not installed: {reason}", RuntimeWarning, stacklevel=3)
    return False


def _bind(lib: ctypes.CDLL) -> None:
    lib.vramfit_alloc_configure.argtypes = (ctypes.c_uint64, ctypes.c_char_p)
    lib.vramfit_alloc_configure.restype = ctypes.c_int
    lib.vramfit_alloc_stats_json.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    lib.vramfit_alloc_stats_json.restype = ctypes.c_ssize_t
    lib.vramfit_alloc_reset_peaks.argtypes = (ctypes.c_int,)
    lib.vramfit_alloc_reset_peaks.restype = None
    lib.vramfit_alloc_reset_accumulated.argtypes = (ctypes.c_int,)
    lib.vramfit_alloc_reset_accumulated.restype = None


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def install(budget_bytes: int, policy: Optional[str] = None) -> bool:
    """Makes vramfit's allocator PyTorch's CUDA allocator with a budget of
    ``budget_bytes`` per GPU (0: no budget). ``policy`` is ``"pytorch"`` or
    ``"vramfit"`` (default: ``$VRAMFIT_ALLOC_POLICY``, else ``"pytorch"``).

    Must run before the first CUDA allocation of the process. Returns True
    once installed (again on later calls), False (with a warning saying
    why, see :func:`last_error`) when the library or CUDA is unavailable or
    PyTorch has already initialised CUDA.
    """
    global _installed
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if policy is not None and policy not in ("pytorch", "vramfit"):
        raise ValueError(f"unknown allocator policy {policy!r}: expected 'pytorch' or 'vramfit'")
    with _lock:
        if _installed is not None:
            return True
        try:
            import torch
        except ImportError:
            return _fail("torch is not importable")
        if not hasattr(torch.cuda, "memory") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
            return _fail("this PyTorch has no CUDAPluggableAllocator")
        if torch.cuda.is_initialized():
            return _fail(
                "CUDA is already initialised in this process; install() must run before the first CUDA allocation"
            )
        path = find_library()
        if path is None:
            return _fail(
                f"{LIBRARY_NAME} not found (install vramfit's wheel, which contains it, or set {LIBRARY_ENV})"
            )
        try:
            lib = ctypes.CDLL(str(path))
            _bind(lib)
        except (OSError, AttributeError) as exc:
            return _fail(f"cannot load {path}: {exc}")
        chosen = policy or os.environ.get("VRAMFIT_ALLOC_POLICY", "").strip() or "pytorch"
        rc = lib.vramfit_alloc_configure(int(budget_bytes), chosen.encode())
        if rc == -2:
            raise ValueError(f"unknown allocator policy {chosen!r}: expected 'pytorch' or 'vramfit'")
        if rc != 0:
            return _fail(f"{path} is already in use in this process")
        try:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(str(path), "vramfit_alloc", "vramfit_free")
            hooks = allocator._allocator
            hooks.set_init_fn(_address(lib, "vramfit_init"))
            hooks.set_reset_fn(_address(lib, "vramfit_empty_cache"))
            hooks.set_memory_fraction_fn(_address(lib, "vramfit_memory_fraction"))
            hooks.set_record_stream_fn(_address(lib, "vramfit_record_stream"))
            if hasattr(hooks, "set_begin_allocate_to_pool"):
                hooks.set_begin_allocate_to_pool(_address(lib, "vramfit_begin_allocate_to_pool"))
            torch.cuda.memory.change_current_allocator(allocator)
        except (RuntimeError, AttributeError) as exc:
            return _fail(f"PyTorch refused the allocator: {exc}")
        state = _Installed(lib, path, int(budget_bytes), chosen, os.getpid())
        state.allocator = allocator
        _patch_torch(torch, state)
        _installed = state
        return True


def install_from_env(environ: Optional[Dict[str, str]] = None) -> bool:
    """``install`` with ``VRAMFIT_BUDGET_BYTES`` minus ``VRAMFIT_CONTEXT_BYTES``
    when the budget is set and ``VRAMFIT_ALLOCATOR`` is not 0/false/off; False
    otherwise."""
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    from .attempt import budget_from_env

    budget, context = budget_from_env(env)
    if budget is None:
        return False
    # The budget covers the whole process; the allocator gets what the CUDA
    # context and libraries leave.
    return install(budget - (context or 0))


def installed() -> bool:
    """Whether vramfit's allocator serves this process."""
    return _installed is not None and _installed.pid == os.getpid()


def is_budget_oom(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the allocator's budget failure."""
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if BUDGET_MARKER in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def flatten(nested: dict, prefix: str = "") -> Dict[str, Any]:
    """Flattens nested counters the way ``torch.cuda.memory_stats`` does
    (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``), keys sorted."""
    out: Dict[str, Any] = {}

    def walk(pre: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{pre}.{key}" if pre else str(key), value)
        else:
            out[pre] = obj

    walk(prefix, nested)
    return dict(sorted(out.items()))


def memory_stats(device: Optional[int] = None) -> Dict[str, Any]:
    """The allocator's counters for ``device`` (default: the current one):
    the keys of ``torch.cuda.memory_stats`` plus ``vramfit.*`` (policy,
    budget, lifetime peaks, OOMs, blocks held back for other streams).
    Empty when the allocator is not installed or the device unused."""
    state = _installed
    if state is None:
        return {}
    if device is None:
        import torch

        device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    nested = state.stats_json(int(device), 0) or {}
    own = state.stats_json(int(device), 1) or {}
    out = flatten(nested)
    out.update({f"vramfit.{key}": value for key, value in own.items()})
    return out


def _patch_torch(torch: Any, state: _Installed) -> None:
    """Routes PyTorch's allocator statistics to the library and refuses
    CUDA graph capture up front."""
    c = torch._C

    def memory_stats_nested(device: int) -> dict:
        return state.stats_json(int(device), 0) or {}

    def reset_peaks(device: int) -> None:
        state.lib.vramfit_alloc_reset_peaks(int(device))

    def reset_accumulated(device: int) -> None:
        state.lib.vramfit_alloc_reset_accumulated(int(device))

    c._cuda_memoryStats = memory_stats_nested
    c._cuda_resetPeakMemoryStats = reset_peaks
    c._cuda_resetAccumulatedMemoryStats = reset_accumulated

    graph_class = getattr(torch.cuda, "CUDAGraph", None)
    if graph_class is not None:
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(
                "CUDA graph capture is not supported under vramfit's allocator (PyTorch's pluggable "
                "allocators have no private graph pools): run without CUDA graphs, e.g. without "
                "torch.compile(mode='reduce-overhead'), or set VRAMFIT_ALLOCATOR=0"
            )

        graph_class.capture_begin = capture_begin
