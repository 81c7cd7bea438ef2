"""The launcher counts this machine's GPUs without importing torch where it can (`ptrun.config.gpus`): the
answer torch would give, and the workers' server is not kept waiting for torch's import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import cli_env

from ptrun.config.gpus import torch_has_cuda, visible_of

SPECS = [
    "",
    "0",
    "1",
    "0,1",
    "1,0",
    "0,1,2,3",
    "3,0",
    "0,5",
    "5,0",
    "2, 3",
    " 1 ,0",
    "0,,1",
    "0,-1,1",
    "-1",
    "0,1,0",
    "1,1",
    "0,9,0",
    "1gpu",
    "GPU-4a5b",
    "MIG-GPU-1/2/3",
    "0,GPU-4a5b",
]


@pytest.mark.parametrize("raw", [0, 1, 4])
def test_cuda_visible_devices_is_read_as_torch_reads_it(raw, monkeypatch):
    """Every list of device numbers gives the count torch's NVML path gives (its parse, trimmed at the first
    number with no device); what this does not read (UUIDs, MIG instances, "1gpu") is left to torch."""
    from torch.cuda import _parse_visible_devices

    left_to_torch = set()
    for spec in SPECS:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
        parsed = _parse_visible_devices()
        ours = visible_of(spec, raw)
        if ours is None:
            left_to_torch.add(spec)
            continue
        torch_count = next((i for i, n in enumerate(parsed) if n >= raw), len(parsed))
        assert ours == torch_count, (spec, raw, ours, parsed)
    assert left_to_torch == {"1gpu", "GPU-4a5b", "MIG-GPU-1/2/3", "0,GPU-4a5b"}
    assert visible_of(None, raw) == raw


def test_a_cuda_build_of_torch_is_told_without_importing_it():
    """A CPU build of torch shows no GPU whatever the machine has; the launcher tells the builds apart by the
    CUDA library the package ships, as torch itself says."""
    assert torch_has_cuda() == torch.backends.cuda.is_built()


@pytest.mark.slow
def test_the_launcher_checks_a_start_without_importing_torch():
    """`ptrun train`'s checks on the launching machine (the default recipe, `nproc_per_node=auto`) count the
    GPUs without torch, and the count is torch's: measured in a fresh process, torch imported only after."""
    code = (
        "import json, sys\n"
        "from ptrun.compose import for_this_machine, resolve\n"
        "cfg = for_this_machine(resolve([], {})).cfg\n"
        "imported = 'torch' in sys.modules\n"
        "import torch\n"
        "gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps([cfg.launcher.nproc_per_node, imported, gpus]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=cli_env())
    assert out.returncode == 0, out.stderr
    workers, imported, gpus = json.loads(out.stdout.strip().splitlines()[-1])
    assert not imported
    assert workers == (gpus or 2)
