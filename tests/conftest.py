"""Shared fixtures: compose configs with Hydra's compose API, and run real workers through elastic_launch."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ptrun.launch import user_cache_dir

# As `ptrun train` does, before anything imports torch._dynamo (its default cache is /tmp/torchinductor_USER).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "torchinductor"))

import pytest  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from ptrun.bench.processes import worker_pids  # noqa: E402,F401  (the tests import it from here)
from ptrun.compose import compose
from ptrun.config import PtrunConfig

# A tiny model and short epochs: multi-process tests pay ~6 s of start-up each, keep the rest small.
TINY = [
    "model.embed_dim=32", "model.depth=2", "model.num_heads=2", "train.global_batch_size=16",
    "launcher.max_restarts=0", "checkpoint.keep=5", "freeze.policy=none", "pipe.length=1", "pipe.microbatches=1",
    "pipe.schedule=GPipe",
]


def compose_config(overrides: list[str], run_dir: Path) -> PtrunConfig:
    return compose(overrides, run_dir=run_dir, recipe="test")


def write_config(cfg: PtrunConfig) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return path


def run_workers(overrides: list[str], run_dir: Path) -> dict:
    """Launch real worker processes (gloo on localhost) through ptrun's own elastic launcher."""
    from ptrun.launch import launch

    cfg = compose_config(overrides, run_dir)
    return launch(cfg, write_config(cfg))


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from ptrun.train import checkpoint

    ckpt = checkpoint.latest_valid(run_dir)
    assert ckpt is not None, f"no checkpoint in {run_dir}"
    return checkpoint.load(ckpt)[0]


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)


LITTER = ("torchelastic_*", "ptrun-*", "torchinductor_*", "pytorch-errorfile-*")
"""What launches have left in the temp directory and /dev/shm (elastic's logs, ptrun's private files, the
AutoCache memory tier, torch's compile cache, the exceptions of workers that failed): a test session must
leave none of it."""


def _litter() -> set[Path]:
    roots = [Path(tempfile.gettempdir()), Path("/dev/shm")]
    return {path for root in roots if root.is_dir() for pattern in LITTER for path in root.glob(pattern)}


@pytest.fixture(scope="session", autouse=True)
def no_litter_left():
    before = _litter()
    yield
    left = sorted(str(p) for p in _litter() - before)
    assert not left, f"the test session left these behind: {left}"
