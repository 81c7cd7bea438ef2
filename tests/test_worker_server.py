"""The workers' server under a TMPDIR whose path leaves no room for a Unix socket's (a scheduler's per-job
directory, a test's): the workers still start from the forkserver, whose socket multiprocessing then keeps in a
directory of /tmp, removed when the launcher ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, cli_env

pytestmark = pytest.mark.slow  # a process of its own starts the forkserver, which imports torch

START = """
import json
import sys
from multiprocessing import forkserver, util
from pathlib import Path

from conftest import compose_config
from ptrun.launcher.worker_server import start_worker_server, stop_worker_server

cfg = compose_config([], Path(sys.argv[1]))
method = start_worker_server(cfg)
print(json.dumps({"method": method, "socket": forkserver._forkserver._forkserver_address, "dir": util.get_temp_dir()}))
stop_worker_server()
"""


def test_a_long_tmpdir_still_starts_the_workers_from_the_forkserver(tmp_path):
    long_tmp = tmp_path / ("t" * 60) / ("u" * 40)
    long_tmp.mkdir(parents=True)
    run = subprocess.run(
        [sys.executable, "-c", START, str(tmp_path / "run")],
        cwd=REPO / "tests",
        env=cli_env(TMPDIR=str(long_tmp)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said["method"] == "forkserver", said
    assert said["socket"].startswith("/tmp/pymp-") and len(said["socket"]) <= 107, said
    assert not any(long_tmp.iterdir()), sorted(long_tmp.iterdir())  # nothing was made in the long TMPDIR
    assert not os.path.exists(said["dir"]), said  # the socket's directory went with the process
