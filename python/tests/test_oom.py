"""The exit protocol: exit 42 with PyTorch's text and the memory summary in the termination log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Optional

import torch  # the protocol is about torch's error: these tests need it

import vramfit

PYTHON_DIR = str(Path(vramfit.__file__).resolve().parent.parent)


def run_script(code: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=PYTHON_DIR, **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full, timeout=120
    )


def test_guard_turns_torch_oom_into_exit_42(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    out = run_script(
        """
        import torch, vramfit
        vramfit.configure(micro_batch=4)
        with vramfit.oom_guard():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        """,
        {"VRAMFIT_TERMINATION_LOG": str(log)},
    )
    assert out.returncode == 42, out.stderr
    text = log.read_text()
    assert text.splitlines()[-1] == "CUDA out of memory. Tried to allocate 2.00 GiB."
    assert "memory summary" in text.lower() or "CUDA was not in use" in text
    assert "exiting with 42" in out.stderr


def test_decorator_and_exit_code_variable(tmp_path: Path) -> None:
    log = tmp_path / "t"
    out = run_script(
        f"""
        import torch, vramfit
        @vramfit.guarded
        def main():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        main()
        """,
        {"VRAMFIT_OOM_EXIT_CODE": "43", "VRAMFIT_TERMINATION_LOG": str(log)},
    )
    assert out.returncode == 43, out.stderr
    assert log.read_text().rstrip().endswith("CUDA out of memory.")


def test_other_errors_pass_through(tmp_path: Path) -> None:
    out = run_script(
        """
        import vramfit
        with vramfit.oom_guard():
            raise ValueError("not memory")
        """,
        {"VRAMFIT_TERMINATION_LOG": str(tmp_path / "t")},
    )
    assert out.returncode == 1
    assert "ValueError: not memory" in out.stderr
    assert not (tmp_path / "t").exists()


def test_an_unwritable_termination_log_still_exits_42() -> None:
    out = run_script(
        """
        import torch, vramfit
        with vramfit.oom_guard(termination_log="/nonexistent/dir/log"):
            raise torch.OutOfMemoryError("CUDA out of memory.")
        """
    )
    assert out.returncode == 42
    assert "CUDA out of memory." in out.stderr


def test_is_oom_knows_torch_and_legacy_errors() -> None:
    assert vramfit.is_oom(torch.OutOfMemoryError("CUDA out of memory."))
    assert vramfit.is_oom(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not vramfit.is_oom(RuntimeError("shape mismatch"))
    assert not vramfit.is_oom(MemoryError())


def test_message_is_marked_when_the_error_text_is_not_pytorchs() -> None:
    from vramfit.oom import oom_message

    assert oom_message(torch.OutOfMemoryError("budget of 10 GiB exceeded")).startswith("CUDA out of memory")


def test_the_message_survives_the_kubelets_4096_byte_tail() -> None:
    # The kubelet keeps the last 4096 bytes of the termination log; a long
    # memory summary must not push PyTorch's text out of it.
    from vramfit.oom import TERMINATION_MESSAGE_LIMIT, termination_report

    message = "CUDA out of memory. Tried to allocate 2.00 GiB."
    report = termination_report(message, "x" * 20_000)
    kept = report.encode("utf-8")[-TERMINATION_MESSAGE_LIMIT:].decode("utf-8")
    assert len(report.encode("utf-8")) <= TERMINATION_MESSAGE_LIMIT
    assert kept.endswith(message)
    assert report.startswith("x")
    short = termination_report(message, "summary")
    assert short == "summary\n\n" + message
