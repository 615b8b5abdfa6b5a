"""vramfit's wheel: the Python package with libvramfit_alloc.so inside it.

The library is built from ../alloc-ffi (crate vramfit-alloc) by
setuptools-rust without Python bindings: it is a plain cdylib that
``vramfit.allocator`` loads with ctypes and hands to
``torch.cuda.memory.CUDAPluggableAllocator``. It links against no Python (it
looks the interpreter's functions up at run time), so the wheel is tagged
``py3-none-linux_x86_64``: any Python 3, this platform, and no manylinux
claim (the library needs the glibc and libstdc++ of the machine it was built
on or newer; docs in README.md).

Build it from a clone of the repository (``hack/wheel.sh``, or ``pip wheel
./python``): the crate lives outside this folder, so a source distribution
cannot build it. ``VRAMFIT_BUILD_ALLOCATOR=0`` builds the pure-Python wheel
without the library (then ``vramfit.allocator`` looks for it as in a source
checkout: ``$VRAMFIT_ALLOCATOR_LIB``, else the memory-fraction fallback).
``VRAMFIT_ALLOC_MANIFEST`` names the crate's Cargo.toml when this folder was
copied elsewhere (hack/wheel.sh builds from such a copy).
"""

import os
from pathlib import Path

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

LIBRARY_NAME = "libvramfit_alloc.so"
HERE = Path(__file__).resolve().parent


def _build_library() -> bool:
    return os.environ.get("VRAMFIT_BUILD_ALLOCATOR", "1").strip().lower() not in ("0", "false", "off", "no")


class bdist_wheel(_bdist_wheel):
    """Tags the wheel py3-none-<platform>: the Python code runs on any
    Python 3 and the library does not link against libpython."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


cmdclass = {"bdist_wheel": bdist_wheel}
rust_extensions = []

if _build_library():
    from setuptools_rust import Binding, RustExtension, Strip
    from setuptools_rust import build_rust as _build_rust

    manifest = Path(os.environ.get("VRAMFIT_ALLOC_MANIFEST") or HERE.parent / "alloc-ffi" / "Cargo.toml")
    if not manifest.is_file():
        raise SystemExit(
            f"vramfit: {manifest} not found. The wheel's {LIBRARY_NAME} is built from the repository's "
            "alloc-ffi crate: build the wheel from a clone (hack/wheel.sh, or pip wheel ./python), or set "
            "VRAMFIT_BUILD_ALLOCATOR=0 for the pure-Python package without the library"
        )

    class build_rust(_build_rust):
        """Installs the library as vramfit/libvramfit_alloc.so, the name
        ``vramfit.allocator`` looks for, instead of an extension module's
        name with the interpreter's suffix (libvramfit_alloc.cpython-3XX-...so)."""

        def get_dylib_ext_path(self, ext, target_fname):
            path = super().get_dylib_ext_path(ext, target_fname)
            if ext.binding is Binding.NoBinding:
                return os.path.join(os.path.dirname(path), LIBRARY_NAME)
            return path

    cmdclass["build_rust"] = build_rust
    rust_extensions.append(
        RustExtension(
            "vramfit.libvramfit_alloc",
            path=str(manifest),
            binding=Binding.NoBinding,
            # The workspace's Cargo.lock, as every other build here.
            cargo_manifest_args=["--locked"],
            # Debug information only: symbol names stay for backtraces.
            strip=Strip.Debug,
        )
    )

setup(cmdclass=cmdclass, rust_extensions=rust_extensions, zip_safe=False)
