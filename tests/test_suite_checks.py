"""The test session's own end-of-session check: a session that leaves a launch's file behind (a file of
`conftest.LITTER` in the temp directory or /dev/shm) fails, naming it, whether pytest runs the tests itself or
hands them to pytest-xdist's workers (then the controller checks, once every worker has ended)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, cli_env

pytestmark = pytest.mark.slow  # two pytest sessions of their own

ANY_TEST = "tests/test_layers.py::test_every_package_has_a_layer"  # a quick one, to load the suite's conftest

LEAVER = """
import tempfile
from pathlib import Path


def test_leaves_a_file():
    Path(tempfile.gettempdir(), "ptrun-left-by-a-test").touch()
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in_process", "xdist"])
def test_a_session_that_leaves_a_file_behind_fails_naming_it(tmp_path, workers):
    tmpdir, leaver = tmp_path / "tmp", tmp_path / "leaver" / "test_leaver.py"
    tmpdir.mkdir()
    leaver.parent.mkdir()
    leaver.write_text(LEAVER)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, ANY_TEST, str(leaver)],
        cwd=REPO,
        env=cli_env(TMPDIR=str(tmpdir)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout + run.stderr
    assert "2 passed" in out, out  # both tests passed: the failure is the session's
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert f"left these behind: ['{tmpdir / 'ptrun-left-by-a-test'}']" in out, out
