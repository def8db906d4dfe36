"""CI's own diagnostics (tests/conftest.py): a hung test shows where every process of the run waits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import python_stacks

HERE = Path(__file__).parent


def test_python_stacks_show_where_another_process_waits():
    code = "import time\ndef waiting_for_a_step():\n    time.sleep(60)\nwaiting_for_a_step()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        text = python_stacks([proc.pid])
    finally:
        proc.kill()
        proc.wait()
    assert f"pid {proc.pid}" in text and "waiting_for_a_step" in text, text


@pytest.mark.slow
def test_a_test_near_its_timeout_prints_the_stacks_then_fails(tmp_path):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs_here():\n    time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "timeout=3", "-q",
                           str(tmp_path / "test_hangs.py")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(HERE.parent)})
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "still running after 2 s" in out, out
    assert out.index("test_hangs_here") < out.index("end of stacks") < out.rindex("Timeout"), out
