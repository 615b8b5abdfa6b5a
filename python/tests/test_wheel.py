"""vramfit's wheel (hack/wheel.sh): libvramfit_alloc.so is inside it, and a
fresh virtualenv with only the wheel installed finds that library, loads it
with ctypes, and installs it as PyTorch's allocator (against a stand-in torch).

The wheel tests build the wheel with ``hack/wheel.sh --profile dev`` when
``VRAMFIT_WHEEL_TEST=1`` (hack/test.sh sets it; the dev profile reuses the
debug build's dependencies), or check the wheel named by ``VRAMFIT_WHEEL``
(a release wheel, say); they are skipped otherwise. The lookup-order tests
run always.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, Iterator

import pytest

from vramfit import allocator

REPO = Path(__file__).resolve().parents[2]
# Read at import: the autouse fixture in conftest.py clears VRAMFIT_* per test.
WHEEL = os.environ.get("VRAMFIT_WHEEL", "").strip()
BUILD = os.environ.get("VRAMFIT_WHEEL_TEST", "") == "1"
PROFILE = os.environ.get("VRAMFIT_WHEEL_PROFILE", "dev")

LIBRARY_IN_WHEEL = f"vramfit/{allocator.LIBRARY_NAME}"
#: What the library must export: the allocation and free functions that
#: torch.cuda.memory.CUDAPluggableAllocator is built from, the hooks
#: allocator.install() sets on it, and what allocator.py calls through ctypes.
PLUGGABLE_ALLOCATOR_SYMBOLS = ("vramfit_alloc", "vramfit_free")
HOOK_SYMBOLS = (
    "vramfit_init",
    "vramfit_empty_cache",
    "vramfit_memory_fraction",
    "vramfit_record_stream",
    "vramfit_begin_allocate_to_pool",
)
CTYPES_SYMBOLS = (
    "vramfit_alloc_configure",
    "vramfit_alloc_stats_json",
    "vramfit_alloc_reset_peaks",
    "vramfit_alloc_reset_accumulated",
)
SYMBOLS = PLUGGABLE_ALLOCATOR_SYMBOLS + HOOK_SYMBOLS + CTYPES_SYMBOLS


def test_the_symbol_list_covers_what_allocator_py_uses() -> None:
    source = Path(allocator.__file__).read_text()
    used = set(re.findall(r"_address\(lib, \"(\w+)\"\)", source))
    used |= set(re.findall(r"lib\.(vramfit_\w+)", source))
    plugged = re.search(r"CUDAPluggableAllocator\(str\(path\), \"(\w+)\", \"(\w+)\"\)", source)
    assert plugged is not None, "allocator.py no longer builds CUDAPluggableAllocator(path, alloc, free)"
    used |= set(plugged.groups())
    assert used and used <= set(SYMBOLS), sorted(used - set(SYMBOLS))


# --- lookup order, without a wheel -------------------------------------------


@pytest.fixture
def package_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """allocator.py as if installed in tmp_path/site-packages/vramfit."""
    package = tmp_path / "site-packages" / "vramfit"
    package.mkdir(parents=True)
    monkeypatch.setattr(allocator, "__file__", str(package / "allocator.py"))
    return package


def test_without_a_packaged_library_nothing_is_found(package_dir: Path) -> None:
    assert allocator.packaged_library() is None
    assert allocator.find_library() is None


def test_the_packaged_library_comes_before_one_beside_the_package(package_dir: Path) -> None:
    beside = package_dir.parent / allocator.LIBRARY_NAME
    beside.write_bytes(b"")
    assert allocator.find_library() == beside
    packaged = package_dir / allocator.LIBRARY_NAME
    packaged.write_bytes(b"")
    assert allocator.packaged_library() == packaged
    assert allocator.find_library() == packaged


def test_the_variable_overrides_the_packaged_library(
    package_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (package_dir / allocator.LIBRARY_NAME).write_bytes(b"")
    own = tmp_path / "own.so"
    own.write_bytes(b"")
    monkeypatch.setenv(allocator.LIBRARY_ENV, str(own))
    assert allocator.find_library() == own
    # A variable naming a missing file is an error to report, not a reason
    # to take another library silently.
    monkeypatch.setenv(allocator.LIBRARY_ENV, str(tmp_path / "missing.so"))
    assert allocator.find_library() is None


# --- the wheel ----------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if WHEEL:
        path = Path(WHEEL)
        assert path.is_file(), f"VRAMFIT_WHEEL={WHEEL} does not exist"
        return path
    if not BUILD:
        pytest.skip("set VRAMFIT_WHEEL_TEST=1 to build the wheel (hack/test.sh does), or VRAMFIT_WHEEL=PATH")
    out = tmp_path_factory.mktemp("wheels")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFIT_")}
    run = subprocess.run(
        [str(REPO / "hack" / "wheel.sh"), "--profile", PROFILE, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=1500,
    )
    assert run.returncode == 0, f"hack/wheel.sh failed:\n{run.stdout}\n{run.stderr}"
    # wheel.sh's summary (path, size, build time) for the test log.
    print(run.stderr.strip().splitlines()[-2])
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out, run.stdout
    return path


def clean_env(**extra: str) -> Dict[str, str]:
    """The environment without anything that points Python at the source
    tree or at another library."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("VRAMFIT_", "PYTHON")) and k not in ("VIRTUAL_ENV", "PIP_FIND_LINKS")
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv (seeing the system's torch) with only the wheel
    installed; yields its python."""
    root = tmp_path_factory.mktemp("venv")
    # This Python's pip installs into the venv (pip >= 22.3: --python), which
    # spares the venv its own pip (10 s); an older pip gets one.
    import pip

    own_pip = tuple(int(p) for p in pip.__version__.split(".")[:2]) < (22, 3)
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", *([] if own_pip else ["--without-pip"]), str(root)],
        check=True, capture_output=True, timeout=300,
    )
    python = root / "bin" / "python"
    pip_command = [str(python), "-m", "pip"] if own_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    install = subprocess.run(
        [*pip_command, "install", "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, env=clean_env(), cwd=root, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield python


def test_the_wheel_holds_the_library_and_says_what_it_is(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert LIBRARY_IN_WHEEL in names, f"{LIBRARY_IN_WHEEL} is missing from {wheel.name}: {sorted(names)}"
        data = z.read(LIBRARY_IN_WHEEL)
        [meta] = [n for n in names if n.endswith(".dist-info/WHEEL")]
        tags = [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines() if line.startswith("Tag:")]
        [record] = [n for n in names if n.endswith(".dist-info/RECORD")]
        recorded = {line.split(",", 1)[0] for line in z.read(record).decode().splitlines()}
    assert data[:4] == b"\x7fELF", "the packaged library is not an ELF file"
    # py3-none: the library links against no libpython (it looks the
    # interpreter up at run time); linux, not manylinux: no such claim.
    assert b"libpython" not in data
    assert tags == ["py3-none-linux_x86_64"], tags
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name
    assert LIBRARY_IN_WHEEL in recorded
    assert "vramfit/py.typed" in names and "vramfit/allocator.py" in names


CHECK_IN_VENV = r'''
import ctypes, json, sys, sysconfig
from pathlib import Path
import vramfit
from vramfit import allocator

class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

found = allocator.find_library()
packaged = allocator.packaged_library()
report = {
    "package": str(Path(vramfit.__file__).resolve().parent),
    "site": str(Path(sysconfig.get_paths()["platlib"]).resolve()),
    "found": str(found) if found else None,
    "packaged": str(packaged) if packaged else None,
    "exported": {},
}
if found is not None:
    lib = ctypes.CDLL(str(found))
    process = ctypes.CDLL(None)
    process.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(DlInfo))
    for name in sys.argv[1:]:
        try:
            address = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        except AttributeError:
            report["exported"][name] = None
            continue
        info = DlInfo()
        # Which object the symbol lives in: the library itself, not one it pulls in.
        assert process.dladdr(address, ctypes.byref(info)) != 0
        report["exported"][name] = str(Path(info.dli_fname.decode()).resolve())
print(json.dumps(report))
'''


def test_the_installed_package_finds_and_loads_its_library(venv: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [str(venv), "-c", CHECK_IN_VENV, *SYMBOLS],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    package = Path(report["package"])
    # The wheel's copy of vramfit, not the source tree's.
    assert package == Path(report["site"]) / "vramfit", report
    expected = str(package / allocator.LIBRARY_NAME)
    assert report["packaged"] == expected, f"the installed package has no {allocator.LIBRARY_NAME}: {report}"
    assert report["found"] == expected, report
    missing = [name for name, where in report["exported"].items() if where is None]
    assert not missing, f"{expected} does not export {missing}"
    elsewhere = {name: where for name, where in report["exported"].items() if where != expected}
    assert not elsewhere, f"symbols resolved outside the library: {elsewhere}"


def test_the_installed_package_installs_its_library_as_pytorchs_allocator(venv: Path, tmp_path: Path) -> None:
    # The wiring check of test_allocator.py, run in the venv against the
    # packaged library with no VRAMFIT_ALLOCATOR_LIB: a stand-in torch on
    # PYTHONPATH (the real one needs a GPU for this), vramfit from the wheel.
    from test_allocator import FAKE_TORCH, WIRING_CHECK

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    packaged = subprocess.run(
        [str(venv), "-c", "from vramfit import allocator; print(allocator.packaged_library())"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=60, check=True,
    ).stdout.strip()
    run = subprocess.run(
        [str(venv), "-c", WIRING_CHECK, packaged],
        capture_output=True, text=True, env=clean_env(PYTHONPATH=str(tmp_path)), cwd=tmp_path, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "wired"


def test_profile_runs_from_the_installed_package_without_pythonpath(venv: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [str(venv), "-m", "vramfit.profile", "--help"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "usage" in run.stdout.lower()

