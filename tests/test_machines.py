"""The machine a run starts on: one worker per visible GPU by default, a worker count beyond the GPUs refused
before anything starts, and the library differences ptrun gates by capability (`ptrun.compat`).

The GPU count is stubbed (`torch.cuda`, which `launcher.nproc_per_node=auto` reads where the launcher cannot count
without torch): how it is counted without torch is tested in test_gpus.py."""

from __future__ import annotations

import inspect
import signal

import pytest
import torch

from ptrun import compat
from ptrun.compose import for_this_machine, resolve
from ptrun.config import ConfigError


@pytest.fixture
def gpus(monkeypatch):
    """Make CUDA report `n` visible GPUs."""

    def show(n: int) -> None:
        monkeypatch.setattr("ptrun.config.launcher.visible_gpus_without_torch", lambda: None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return show


@pytest.mark.parametrize("count", [1, 4])
def test_the_default_starts_one_worker_per_visible_gpu(gpus, count, tmp_path):
    from ptrun.launcher.launch import launch_config

    gpus(count)
    cfg = for_this_machine(resolve([], {})).cfg
    assert cfg.launcher.nproc_per_node == count
    # what elastic is asked to start on this machine
    assert launch_config(cfg, start_method="spawn").nproc_per_node == count


def test_the_default_on_a_machine_without_a_gpu_is_two_emulated_devices(gpus, tmp_path):
    gpus(0)
    assert for_this_machine(resolve([], {})).cfg.launcher.nproc_per_node == 2


def test_more_workers_than_gpus_is_refused_in_one_line(gpus, tmp_path):
    gpus(1)
    with pytest.raises(ConfigError) as e:
        for_this_machine(resolve(["launcher.nproc_per_node=2"], {}))
    assert str(e.value) == (
        "launcher.nproc_per_node=2 is not allowed: at most the 1 GPU this machine shows "
        "(CUDA_VISIBLE_DEVICES), or auto for one worker per GPU"
    )
    # gloo workers run on the CPU, whatever GPUs there are
    gloo = for_this_machine(resolve(["launcher.nproc_per_node=2", "launcher.backend=gloo"], {}))
    assert gloo.cfg.launcher.nproc_per_node == 2


def test_nccl_without_a_gpu_is_refused(gpus, tmp_path):
    gpus(0)
    with pytest.raises(ConfigError, match=r"launcher.backend='nccl' is not allowed: gloo or auto"):
        for_this_machine(resolve(["launcher.backend=nccl"], {}))


def test_more_workers_than_gpus_exits_2_before_any_worker(gpus, tmp_path, cli):
    gpus(1)
    out = cli("train", "launcher.nproc_per_node=4", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "launcher.nproc_per_node=4 is not allowed: at most the 1 GPU" in out.stderr
    assert not (tmp_path / "run").exists()


# ---- capability gates ----------------------------------------------------------------------------------


def test_causal_mask_keywords_follow_the_function_signature():
    positions = torch.arange(5)[None]

    def new(config, inputs_embeds, attention_mask, cache, position_ids=None):  # transformers >= 5.24
        pass

    def old(config, inputs_embeds, attention_mask, cache_position=None, past_key_values=None, position_ids=None):
        pass

    assert compat.causal_mask_kwargs(new, positions).keys() == {"cache", "position_ids"}
    got = compat.causal_mask_kwargs(old, positions)
    assert got.keys() == {"past_key_values", "cache_position", "position_ids"} and got["past_key_values"] is None
    assert torch.equal(got["cache_position"], positions[0])
    # the installed transformers accepts what the gate gives it
    from transformers.masking_utils import create_causal_mask

    assert set(compat.causal_mask_kwargs(create_causal_mask, positions)) <= set(
        inspect.signature(create_causal_mask).parameters
    )


def test_launch_config_keeps_only_the_fields_this_torch_knows(tmp_path):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    kwargs = compat.launch_config_kwargs(
        {
            "min_nodes": 1,
            "max_nodes": 1,
            "nproc_per_node": 1,
            "logs_specs": DefaultLogsSpecs(log_dir=str(tmp_path)),
            "shutdown_timeout": 5,
            "a_field_no_torch_has": 1,
        }
    )
    assert "a_field_no_torch_has" not in kwargs
    LaunchConfig(**kwargs)  # builds


class _Context:
    def __init__(self):
        self.closed = []

    def close(self, death_sig=None, timeout=30):
        self.closed.append((death_sig, timeout))


def test_agent_shutdown_gives_the_grace_to_an_agent_whose_shutdown_takes_none():
    class OldAgent:  # torch < 2.12: `_shutdown(death_sig)`, the context's default grace
        def __init__(self):
            self._pcontext = _Context()

        def _shutdown(self, death_sig=signal.SIGTERM):
            self._pcontext.close(death_sig)

    class NewAgent(OldAgent):
        def _shutdown(self, death_sig=signal.SIGTERM, timeout=30):
            self._pcontext.close(death_sig, timeout)

    for cls in (OldAgent, NewAgent):
        agent = cls()
        compat.agent_shutdown(agent, agent._shutdown, cls, signal.SIGINT, 7)
        assert agent._pcontext.closed == [(signal.SIGINT, 7)], cls
        assert agent._pcontext.close.__func__ is _Context.close  # put back


def test_ddp_takes_the_buffer_keyword_this_torch_knows():
    from torch.nn.parallel import DistributedDataParallel

    (key,) = compat.ddp_no_buffer_sync()
    assert key in inspect.signature(DistributedDataParallel.__init__).parameters


@pytest.mark.parametrize("recipe", ["digits_vit", "bbc_news_bert", "bbc_news_lora"])
@pytest.mark.slow
def test_the_workers_preloaded_modules_leave_wandb_out(recipe):
    """The forkserver imports each family's library once for all workers. `import timm` alone imports wandb when
    it is installed (seconds at every start, and a temporary directory a killed worker leaves behind); the
    modules preloaded must not, though wandb is installed here."""
    import importlib.util
    import subprocess
    import sys

    from ptrun.launcher.worker_server import worker_modules

    assert importlib.util.find_spec("wandb") is not None, "wandb is installed (ptrun[trackers]): the test needs it"
    modules = worker_modules(for_this_machine(resolve([f"recipe={recipe}"], {})).cfg)
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('wandb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"], modules


def test_the_gpu_switches_reach_torch_on_a_gpu_and_nothing_else_on_the_cpu():
    """`device.tf32` and `device.cudnn_benchmark` are what a worker on a GPU runs with (TF32 matmuls by default,
    as a user's own loop on a GPU has them); a CPU worker leaves torch's switches alone. torch's switches are
    process-wide flags, settable without a GPU; they are put back after the test."""
    from ptrun.config.launcher import DeviceConfig
    from ptrun.launcher.worker import use_gpu_switches

    flags = [
        (torch.backends.cuda.matmul, "allow_tf32"),
        (torch.backends.cudnn, "allow_tf32"),
        (torch.backends.cudnn, "benchmark"),
    ]
    before = [getattr(owner, name) for owner, name in flags]
    try:
        for owner, name in flags:
            setattr(owner, name, False)
        gpu = torch.device("cuda", 0)
        use_gpu_switches(DeviceConfig(), torch.device("cpu"))
        assert [getattr(owner, name) for owner, name in flags] == [False, False, False]
        use_gpu_switches(DeviceConfig(), gpu)
        assert [getattr(owner, name) for owner, name in flags] == [True, True, True]
        use_gpu_switches(DeviceConfig(tf32=False, cudnn_benchmark=True), gpu)
        assert [getattr(owner, name) for owner, name in flags] == [False, False, True]
    finally:
        for (owner, name), value in zip(flags, before, strict=True):
            setattr(owner, name, value)
