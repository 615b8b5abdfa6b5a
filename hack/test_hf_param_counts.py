"""The committed parameter-count fixture is current against the installed transformers."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_fixture_is_current():
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_param_counts.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
