"""The static type check, as one test: ``python -m mypy`` ([tool.mypy] in pyproject.toml).

It runs inside the suite so that pytest-xdist schedules it beside the other tests (it is about
a minute of one core on the CI machine) instead of before them; marked slow, it starts first.
"""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_finds_no_error():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
