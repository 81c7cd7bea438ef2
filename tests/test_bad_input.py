"""Bad input: the config keys of test_cli.BAD_INPUT, data files, checkpoints, the environment and the run
directory. Each case must end with its exit code, one line `ptrun: error: ...` naming the key or file and
what is allowed, no traceback, and the files that were in the run directory before byte for byte as they
were. docs/errors.md lists every message.

Cases refused before any worker starts call `ptrun.cli.main` in this process (the `cli` fixture), as the
console script does; a few run the console script itself for the exit-code contract, and the cases that
need workers (or a resource limit) run it in a process of their own."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import REPO, TINY_MODEL, CliResult, assert_one_error_line, closed_port, run_ptrun, start_ptrun
from test_cli import BAD_INPUT

TINY = [
    *TINY_MODEL,
    "train.epochs=1",
    "train.max_steps_per_epoch=2",
    "train.global_batch_size=16",
    "train.export=false",
]
# Data errors surface in the workers: one worker is enough and halves the start-up cost.
ONE_WORKER = ["launcher.nproc_per_node=1", "pipe.length=1", "pipe.microbatches=1"]
TINY_BERT = ["model=bert_base", "model.pretrained=null"]  # sized by TINY
DIST = pytest.mark.dist  # cases with worker processes (~10 s each) or a real run's checkpoints
SLOW = pytest.mark.slow  # all of those but test_cifar10_folder_of_garbage, the fast tier's refusal by a worker
IMAGEFOLDER_LAYOUT = (
    "expected class folders (path/train/<class>/*.png and path/val/<class>/*.png, or path/<class>/*.png)"
)

# The key part of each case's error line (paths vary, so they are left out). docs/errors.md quotes them all.
MESSAGES = {
    "imagefolder_without_images": "found no images; " + IMAGEFOLDER_LAYOUT,
    "imagefolder_corrupt_image": "is not a readable image (UnidentifiedImageError: cannot identify image file",
    "cifar10_garbage": "is not a CIFAR python pickle (",
    "glue_without_task_files": "found no sst2 train and eval files; expected the GLUE TSV layout "
    "(path/SST-2/train.tsv + dev.tsv)",
    "squad_not_json": "is not SQuAD JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0)); "
    "expected SQuAD v1.1 JSON",
    "resume_another_model": "is of model vit_tiny_patch16_224 with 6 units, not vit_tiny_patch16_224 with 8 units; "
    "resume with the run's model settings or choose another hydra.run.dir",
    "resume_corrupt_checkpoint": "params-stage0.safetensors does not match its checksum; restore it, or start a "
    "new run in another hydra.run.dir",
    "resume_manifest_not_json": "manifest.json is unreadable (JSONDecodeError); restore it, or start a new run "
    "in another hydra.run.dir",
    "resume_another_adapter": "is of a run with adapter=",  # either way: the test checks the rest
    "resume_without_checkpoint": "holds no checkpoint to resume from; leave train.resume off to start a new run, "
    "or set hydra.run.dir to the run to continue",
    "rdzv_port_in_use": "is not free on this machine (Address already in use); choose a free port, or "
    "localhost:0 for any",
    "rdzv_endpoint_unparsable": "launcher.rdzv_endpoint='localhost:http' is not allowed: host:port with a port "
    "0-65535 (localhost:0 picks a free one)",
    "rdzv_host_unknown": "does not resolve (",  # the resolver's reason varies: the rest is checked below
    "cache_memory_unavailable": "(File too large); lower cache.max_memory",
    "run_dir_is_a_file": "is not allowed: a directory to create or write into (",
    "hf_dir_without_weights": "no weights in the directory (model.safetensors, model.safetensors.index.json, "
    "pytorch_model.bin)",
    "unsupported_model_type": "is not allowed: a Hugging Face model of a supported model_type (bert, roberta, "
    "xlm-roberta, electra, distilbert, deberta-v2, modernbert, gpt2, llama, qwen2, qwen3, "
    "mistral); ",
    "task_the_family_does_not_do": "model.task='qa' is not allowed: one of causal_lm, classification, regression "
    "for a llama model",
    "causal_lm_without_a_decoder": "model.task='causal_lm' is not allowed: causal_lm only for a decoder given as "
    "model.pretrained",
    "auto_length_batch_of_one": "pipe.length=auto: no layout fits 2 workers: K=1: train.global_batch_size=1 cannot be "
    "split evenly over a data-parallel width of 2; K=2: no micro-batch count divides "
    "the per-replica batch 1 and suits pipe.schedule=1F1B at pipe.length=2",
    "wandb_without_login": "logger=wandb: no W&B login; run `wandb login`, or set WANDB_MODE=offline",
    "mlflow_server_unreachable": "is not reachable (Connection refused); start the tracking server, or unset "
    "MLFLOW_TRACKING_URI to log into RUN_DIR/mlflow.db",
}


def changed(overrides: list[str], *changes: str) -> list[str]:
    """`overrides` with the keys of `changes` set to their new values."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + list(changes)


def ptrun_train(*args: str, cwd: Path, limit_file_size: int | None = None) -> subprocess.CompletedProcess:
    """`ptrun train ARGS` in a fresh process (of this checkout's ptrun), optionally with RLIMIT_FSIZE set."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    return run_ptrun("train", *args, cwd=cwd, preexec_fn=limit if limit_file_size else None)


def snapshot(path: Path) -> dict[str, str]:
    """Every file under `path` (or `path` itself, a file) -> sha256 of its bytes; directories -> 'dir'."""
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(path.rglob("*"))
    }


def assert_one_line(out: subprocess.CompletedProcess | CliResult, case: str, code: int = 2) -> None:
    line = assert_one_error_line(out, code)
    print(line)  # `pytest -rP` shows every case's line (docs/errors.md quotes them)
    assert MESSAGES[case] in line, line


def run_case(case: str, run_dir: Path, *args: str, cli=None, may_add: bool = False, **kwargs) -> tuple[str, set[str]]:
    """Run `ptrun train ARGS` on `run_dir`, in this process through `cli` (the fixture) where given, else in
    a process of its own; check the one-line error, and that every file the run directory held before is
    unchanged. A failed start adds nothing either, unless `may_add` (a run that had started before it met
    the bad input), and in this process no workers' server is left running. Returns the error line and the
    files added."""
    before = snapshot(run_dir) if run_dir.exists() else {}
    argv = [*args, f"hydra.run.dir={run_dir}"]
    out = cli("train", *argv, cwd=run_dir.parent) if cli else ptrun_train(*argv, cwd=run_dir.parent, **kwargs)
    assert_one_line(out, case)
    if cli:  # the workers' server, started once the config was good, went with the refusal
        from multiprocessing import forkserver

        assert forkserver._forkserver._forkserver_pid is None, case
    after = snapshot(run_dir) if run_dir.exists() else {}
    assert {k: after.get(k) for k in before} == before
    if not may_add:
        assert after == before and (before or not run_dir.exists())
    return out.stderr.strip(), set(after) - set(before)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory that already holds something of the user's (but no checkpoint, so a run may start)."""
    path = tmp_path / "run"
    path.mkdir()
    (path / "notes.txt").write_text("the data moved to /scratch on monday\n")
    return path


# ---- data paths and formats ---------------------------------------------------------------------------


def test_hugging_face_directory_without_weights(tmp_path, run_dir, cli):
    """A model directory with its config.json but no weights file is refused before any worker starts."""
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "bert",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "vocab_size": 100,
                "max_position_embeddings": 64,
            }
        )
    )
    run_case("hf_dir_without_weights", run_dir, "recipe=bbc_news_bert", f"model.pretrained={model}", *TINY[3:], cli=cli)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    from hf_families import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("llama"))


def test_unsupported_model_type(tiny_llama, tmp_path, run_dir, cli):
    """A directory of a model_type ptrun cannot split (here a T5 config beside Llama weights)."""
    model = tmp_path / "t5"
    shutil.copytree(tiny_llama, model)
    (model / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 32}))
    run_case("unsupported_model_type", run_dir, "recipe=bbc_news_bert", f"model.pretrained={model}", *TINY[3:], cli=cli)


def test_task_the_family_does_not_do(tiny_llama, tmp_path, run_dir, cli):
    """Question answering (SQuAD) with a decoder."""
    run_case(
        "task_the_family_does_not_do",
        run_dir,
        "recipe=bert_squad",
        f"model.pretrained={tiny_llama}",
        f"data.path={tmp_path}",
        *TINY[3:],
        cli=cli,
    )


def test_causal_lm_without_a_decoder(run_dir, cli):
    run_case("causal_lm_without_a_decoder", run_dir, "model.task=causal_lm", *TINY, cli=cli)


@SLOW
@DIST
def test_imagefolder_without_images(tmp_path, run_dir):
    data = tmp_path / "images"
    (data / "cats").mkdir(parents=True)  # a class folder without images, and a stray file
    (data / "dogs").mkdir()
    (data / "dogs" / "README.txt").write_text("images to follow\n")
    run_case(
        "imagefolder_without_images",
        run_dir,
        "data=imagefolder",
        f"data.path={data}",
        "auto.cache=false",
        *TINY,
        *ONE_WORKER,
    )


@SLOW
@DIST
def test_imagefolder_with_a_corrupt_image(tmp_path, run_dir):
    """Images are decoded as they are read (ImageNet has 1.28 M of them), so a corrupt one is found while
    training: the run has started, and stops at that file."""
    from PIL import Image

    data = tmp_path / "images"
    for c, name in enumerate(("cats", "dogs")):
        (data / name).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (8, 8), (30 * i, 100 * c, 0)).save(data / name / f"{i}.png")
    (data / "cats" / "3.png").write_bytes(b"this is not a PNG\n" * 10)
    line, _ = run_case(
        "imagefolder_corrupt_image",
        run_dir,
        "data=imagefolder",
        f"data.path={data}",
        "data.image_size=8",
        "auto.cache=false",
        *TINY,
        *ONE_WORKER,
        may_add=True,
    )
    assert str(data / "cats" / "3.png") in line


@DIST
@pytest.mark.slow
def test_cifar10_folder_of_garbage(tmp_path, run_dir):
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    noise = random.Random(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(noise.randbytes(4096))
    line, _ = run_case("cifar10_garbage", run_dir, "data=cifar10", f"data.path={folder.parent}", *TINY, *ONE_WORKER)
    assert str(folder) in line


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    """A BERT WordPiece tokenizer directory the text sources load (written by hand: no transformers import)."""
    path = tmp_path_factory.mktemp("tokenizer")
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film"]) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return str(path)


@SLOW
@DIST
def test_glue_folder_without_the_tasks_files(tmp_path, tokenizer):
    """With a run directory that did not exist: the failed start removes the one Hydra made for it."""
    data = tmp_path / "glue"
    (data / "CoLA").mkdir(parents=True)  # another task's folder
    (data / "CoLA" / "train.tsv").write_text("gj04\t1\t\tour friends won't buy this analysis.\n")
    run_case(
        "glue_without_task_files",
        tmp_path / "run",
        "data=glue",
        "data.task=sst2",
        f"data.path={data}",
        f"data.tokenizer={tokenizer}",
        *TINY_BERT,
        *TINY,
        *ONE_WORKER,
    )


@SLOW
@DIST
def test_squad_file_that_is_not_json(tmp_path, run_dir, tokenizer):
    data = tmp_path / "squad"
    data.mkdir()
    (data / "train-v1.1.json").write_text("<html>404 Not Found</html>\n")  # a failed download
    (data / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": []}))
    line, _ = run_case(
        "squad_not_json",
        run_dir,
        "data=squad",
        "model.task=qa",
        f"data.path={data}",
        f"data.tokenizer={tokenizer}",
        *TINY_BERT,
        *TINY,
        *ONE_WORKER,
    )
    assert str(data / "train-v1.1.json") in line


# ---- checkpoints ----------------------------------------------------------------------------------------

BASE_RUN = [
    *changed(TINY, "train.epochs=2"),
    *ONE_WORKER,
    "freeze.policy=schedule",
    "freeze.blocks=[0,1]",
    "cache.min_frozen_units=1",
    "auto.cache=true",
]
"""A real two-epoch run (one worker, to save time) that freezes a block after the first epoch and then trains
from AutoCache, so its checkpoints hold a plan with a cached prefix. The resumes keep the default
launcher.max_restarts=3: bad input must not be restarted into."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    out = ptrun_train(*BASE_RUN, f"hydra.run.dir={run}", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    latest = sorted((run / "checkpoints").iterdir())[-1]
    assert json.loads((latest / "trainer.json").read_text())["plan"]["cached_units"] > 0
    return run


@pytest.fixture
def copy_of_run(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


@SLOW
@DIST
def test_resume_with_another_model(copy_of_run):
    """With the default two workers as a 2-stage pipeline (a resume may change the world size): both workers
    find the mismatch, and one line is printed."""
    two_workers = [o for o in BASE_RUN if o not in ONE_WORKER]
    run_case("resume_another_model", copy_of_run, *changed(two_workers, "model.depth=3"), "train.resume=true")


@SLOW
@DIST  # the checkpoints are a real run's
@pytest.mark.parametrize("case", ["resume_corrupt_checkpoint", "resume_manifest_not_json"])
def test_resume_with_only_broken_checkpoints(case, copy_of_run, cli):
    for ckpt in (copy_of_run / "checkpoints").iterdir():
        if case == "resume_corrupt_checkpoint":
            params = ckpt / "params-stage0.safetensors"
            data = bytearray(params.read_bytes())
            data[-64:] = bytes(b ^ 0xFF for b in data[-64:])  # flipped bits in the tensor data
            params.write_bytes(bytes(data))
        else:
            (ckpt / "manifest.json").write_text("{'files': truncated")
    run_case(case, copy_of_run, *BASE_RUN, "train.resume=true", cli=cli)


@pytest.mark.parametrize("saved,asked", [("none", "lora"), ("lora", "none")])
def test_resume_with_another_adapter(saved, asked, run_dir, cli):
    """A checkpoint of adapters holds no base weights, one of full fine-tuning no adapters: the launcher reads
    which the newest valid checkpoint holds (its trainer.json) and refuses the other before any worker."""
    ckpt = run_dir / "checkpoints" / "step_00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.json").write_text(json.dumps({"model": {"name": "m", "num_units": 6, "adapter": saved}}))
    digest = hashlib.sha256((ckpt / "trainer.json").read_bytes()).hexdigest()
    size = (ckpt / "trainer.json").stat().st_size
    manifest = {"format": 1, "files": {"trainer.json": {"sha256": digest, "bytes": size}}}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    line, _ = run_case("resume_another_adapter", run_dir, *TINY, "train.resume=true", f"adapter={asked}", cli=cli)
    assert line.endswith(
        f"adapter={asked!r} is not allowed: checkpoint {ckpt} is of a run with adapter={saved}; resume with "
        f"adapter={saved} or start a new run in another hydra.run.dir"
    )


def test_resume_without_a_checkpoint(run_dir, cli):
    run_case("resume_without_checkpoint", run_dir, *TINY, "train.resume=true", cli=cli)


# ---- environment ----------------------------------------------------------------------------------------


def test_rendezvous_port_in_use(run_dir, cli):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line, _ = run_case("rdzv_port_in_use", run_dir, *TINY, f"launcher.rdzv_endpoint=localhost:{port}", cli=cli)
    assert f"launcher.rdzv_endpoint='localhost:{port}': port {port}" in line


def test_rendezvous_endpoint_that_does_not_parse(run_dir, cli):
    run_case("rdzv_endpoint_unparsable", run_dir, *TINY, "launcher.rdzv_endpoint=localhost:http", cli=cli)


def test_rendezvous_host_that_does_not_resolve(run_dir, cli):
    """`.invalid` never resolves (RFC 2606). torch would retry in its store client until the join timeout and
    then print pages of C++ stack frames."""
    line, _ = run_case("rdzv_host_unknown", run_dir, *TINY, "launcher.rdzv_endpoint=nosuchhost.invalid:29400", cli=cli)
    assert line.startswith(
        "ptrun: error: launcher.rdzv_endpoint='nosuchhost.invalid:29400': host 'nosuchhost.invalid' does not resolve ("
    )
    assert line.endswith("); use a host name or address every machine resolves, or localhost:0 for one machine")


@pytest.mark.slow
def test_a_job_of_two_machines_says_it_is_waiting_for_them(tmp_path):
    """Not an error: the first machine of a two-machine job says what it waits for, where and how long, instead
    of waiting silently. This machine's host name stands for the first machine's; no second one comes."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    endpoint = f"{socket.gethostname()}:{port}"
    # SIGKILLed below, the launcher cleans up nothing: its private files go to a temp dir of its own, whose path
    # is too long for the workers' forkserver's Unix socket (about 107 bytes), as a user's TMPDIR may be: the
    # launcher starts its workers another way
    tmp = tmp_path / ("long-temp-dir-" * 8)
    tmp.mkdir()
    agent = start_ptrun(
        "train",
        *TINY,
        "launcher.nnodes=2",
        f"launcher.rdzv_endpoint={endpoint}",
        "launcher.rdzv_id=wait-test",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"TMPDIR": str(tmp)},
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    silent = threading.Timer(120, os.killpg, (agent.pid, signal.SIGKILL))  # a silent wait ends the test
    silent.start()
    try:
        line = agent.stderr.readline().strip()
    finally:
        silent.cancel()
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
    rest = agent.stderr.read()  # what followed, to show if the line is not the one expected
    assert line == f"ptrun: waiting up to 900 s for 2 machines to join at {endpoint} (run the same command on each)", (
        rest
    )


@SLOW
@DIST
def test_no_room_for_the_activation_cache(copy_of_run):
    """Resuming into the cached plan with two workers reserves the node's shared cache memory tier (~4 MB) at
    once (one worker would keep its entries in its own memory); a file-size limit of 1 MB makes the kernel
    refuse it (EFBIG), as a full /dev/shm would (ENOSPC). Nothing of the run changes, but the store's lock file
    in cache.dir (RUN_DIR/cache by default) stays behind: other workers may be waiting on it, so only a run
    that finishes removes it."""
    two_workers = [o for o in BASE_RUN if o not in ONE_WORKER]
    line, added = run_case(
        "cache_memory_unavailable",
        copy_of_run,
        *two_workers,
        "train.resume=true",
        may_add=True,
        limit_file_size=1 << 20,
    )
    assert line.startswith("ptrun: error: cache.max_memory: cannot reserve ")
    lock = next(iter(added - {"cache"}), "")
    assert added == {"cache", lock} and lock.startswith("cache/entries-") and lock.endswith(".lock")


# ---- the layout ----------------------------------------------------------------------------------------------


def test_a_batch_that_no_layout_of_two_workers_can_split(run_dir, cli):
    """`pipe.length=auto` with two workers and a batch of one sample: each length named with the rule it
    breaks (not memory, which is plentiful), before any worker starts."""
    line, _ = run_case(
        "auto_length_batch_of_one", run_dir, *TINY, "train.global_batch_size=1", "launcher.nproc_per_node=2", cli=cli
    )
    assert line.endswith("(at least pipe.length=2 for 1F1B)") and "GiB" not in line


# ---- the trackers --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_wandb_online_without_a_login(no_wandb_login, run_dir, cli):
    """wandb would start the workers and fail in rank 0's `wandb.init` half a minute later."""
    line, _ = run_case("wandb_without_login", run_dir, *TINY, "logger=wandb", cli=cli)
    assert line == "ptrun: error: " + MESSAGES["wandb_without_login"]


def test_the_console_script_refuses_wandb_without_a_login(no_wandb_login, tmp_path):
    """The same in a process of its own, where wandb is imported afresh: one line, nothing on stdout."""
    out = run_ptrun("train", *TINY, "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_line(out, "wandb_without_login")
    assert out.stdout == "" and not (tmp_path / "run").exists()


def test_mlflow_tracking_server_that_does_not_answer(run_dir, cli, monkeypatch):
    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    line, _ = run_case("mlflow_server_unreachable", run_dir, *TINY, "logger=mlflow", cli=cli)
    assert line.startswith(f"ptrun: error: logger=mlflow: MLFLOW_TRACKING_URI={uri} is not reachable (")


# ---- the run directory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [".", "sub"])
def test_run_dir_that_is_a_file(where, tmp_path, cli):
    path = tmp_path / "run"
    path.write_text("not a directory\n")
    target = path if where == "." else path / where
    before = snapshot(path)
    out = cli("train", *TINY, f"hydra.run.dir={target}", cwd=tmp_path)
    assert_one_line(out, "run_dir_is_a_file")
    assert f"({path} is a file)" in out.stderr and snapshot(path) == before


def test_run_dir_probes_of_agents_sharing_it_do_not_race(tmp_path):
    """The agents of a multi-machine job share one run directory and check it at once: the probe makes a
    directory of its own beside the missing one, so concurrent checks neither fail nor leave anything."""
    from concurrent.futures import ThreadPoolExecutor

    from ptrun.launcher.start import check_run_dir_path

    target = tmp_path / "shared" / "job"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: check_run_dir_path(str(target)), range(400)))
    assert list(tmp_path.iterdir()) == []


def test_run_dir_that_cannot_be_created(tmp_path, cli):
    """A parent that passes the permission bits but refuses a directory (/proc; a read-only mount alike):
    one line naming what cannot be created, and nothing left of the probe."""
    out = cli("train", *TINY, "hydra.run.dir=/proc/ptrun-run/a", cwd=tmp_path)
    assert_one_line(out, "run_dir_is_a_file")
    assert "(/proc/ptrun-run cannot be created: " in out.stderr and not Path("/proc/ptrun-run").exists()


# ---- the config keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("args,message", BAD_INPUT, ids=[a[0] for a, _ in BAD_INPUT])
def test_bad_config_in_process_is_one_line_exit_2_and_touches_nothing(args, message, tmp_path, cli):
    """test_cli.BAD_INPUT through `ptrun.cli.main` in this process, the console script's own entry point (what
    a process of its own adds, its exit code and its stderr, is checked at each stage a start can be refused
    at: test_the_console_script_exits_2_with_one_line)."""
    run_dir = tmp_path / "run"
    line = assert_one_error_line(cli("train", *args, f"hydra.run.dir={run_dir}", cwd=tmp_path))
    assert message in line, line
    assert not run_dir.exists()


def test_in_process_calls_do_not_affect_each_other(tmp_path, cli):
    """A refusal in Hydra's compose API, one inside Hydra's app (its task function), the first again, then a
    composition as the other tests make them: the same lines each time, and the config as asked."""
    from conftest import compose_config

    lines = [
        assert_one_error_line(cli("train", *argv, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
        for argv in (["train.epoch=3"], [*TINY, "train.resume=true"], ["train.epoch=3"], [*TINY, "train.resume=true"])
    ]
    assert lines[0] == lines[2] and lines[1] == lines[3] and lines[0] != lines[1]
    assert MESSAGES["resume_without_checkpoint"] in lines[1]
    assert compose_config(["train.epochs=3"], tmp_path).train.epochs == 3
    assert not (tmp_path / "run").exists()


# ---- the exit-code contract of the console script ------------------------------------------------------

CONTRACT = {  # a refusal at each stage of a start: composition, validation, the run directory, Hydra's task
    "unknown_key": (["train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    "not_allowed": (["pipe.length=3"], "pipe.length=3 is not allowed: a divisor of the world size 2"),
    "run_dir_is_a_file": (["hydra.run.dir={tmp}/file"], MESSAGES["run_dir_is_a_file"]),
    "resume_without_checkpoint": (
        ["train.resume=true", "hydra.run.dir={tmp}/run"],
        MESSAGES["resume_without_checkpoint"],
    ),
}


@pytest.mark.parametrize("case", sorted(CONTRACT))
def test_the_console_script_exits_2_with_one_line(case, tmp_path):
    """What a shell or a scheduler sees: the installed `ptrun` script in a process of its own, exit code 2,
    one line on stderr, nothing on stdout, no run directory made."""
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("the data moved to /scratch on monday\n")
    before = snapshot(tmp_path)
    args, message = CONTRACT[case]
    out = run_ptrun("train", *TINY, *(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    assert message in assert_one_error_line(out) and out.stdout == ""
    assert snapshot(tmp_path) == before


# ---- the catalogue ---------------------------------------------------------------------------------------


def test_every_message_is_in_the_catalogue():
    doc = (REPO / "docs" / "errors.md").read_text()
    missing = [m for _, m in BAD_INPUT if m not in doc] + [m for m in MESSAGES.values() if m not in doc]
    assert not missing, missing
