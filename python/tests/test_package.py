"""The package installs and imports without torch."""

import os
import subprocess
import sys
from pathlib import Path

import vramfit


def test_package_has_a_version_and_is_typed() -> None:
    assert vramfit.__version__
    from importlib import resources

    assert resources.files("vramfit").joinpath("py.typed").is_file()


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, vramfit; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(Path(vramfit.__file__).parent.parent))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"
