"""SLURM: the host-list expander, where each launcher field comes from (SLURM's environment, the command line,
the config), the refusals, and two `ptrun train` agents started with SLURM-style environments forming one
two-node job (ptrun/config/slurm.py, docs/slurm.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import TINY, command_args, final_params, free_port, run_workers

from ptrun.config import ConfigError, LauncherConfig
from ptrun.config.slurm import BASE_PORT, expand_hostlist, explicit_fields, first_host, from_slurm, read_job, summary

# What srun gives the task on node 1 of a two-node job submitted with --ntasks-per-node=1.
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
DEFAULT = LauncherConfig()


# ------------------------------------------------------------------------------------------------ host lists


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("a", ["a"]),
        ("a,b", ["a", "b"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[01-03,7]", ["n01", "n02", "n03", "n7"]),
        ("r1n[1-2],r2n3", ["r1n1", "r1n2", "r2n3"]),
        ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
        ("n[8-10]", ["n8", "n9", "n10"]),  # no padding: the lower bound has one digit
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # several brackets: the first varies slowest
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),  # text after the bracket
        ("node-1.cluster.org,10.0.0.7", ["node-1.cluster.org", "10.0.0.7"]),
        (" n[5] ", ["n5"]),
    ],
)
def test_host_lists_expand_like_scontrol_show_hostnames(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


def test_the_first_host_of_a_huge_list_is_read_without_expanding_it():
    assert first_host("n[000001-999999999]") == "n000001"


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "SLURM_NODELIST='' is not allowed"),
        ("n[1-3", "'[' without ']'"),
        ("n1-3]", "']' without '['"),
        ("n[[1]]", "nested '['"),
        ("n[3-1]", "cannot read the range '3-1'"),
        ("n[a-b]", "cannot read the range 'a-b'"),
        ("n[]", "cannot read the range ''"),
        ("a,,b", "an empty host name"),
        ("[1-2]", "an empty host name"),
        ("a,b[2-1]", "cannot read the range '2-1'"),  # broken after the first host: still an error
    ],
)
def test_malformed_host_lists_are_one_line_errors(text, why):
    with pytest.raises(ConfigError) as e:
        first_host(text, "SLURM_NODELIST")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("SLURM_NODELIST=") and why in msg
    assert "a SLURM host list such as gpu[01-03,07],cpu5" in msg


# ---------------------------------------------------------------------------------------------- precedence


def test_inside_srun_the_job_fills_nodes_rendezvous_and_id():
    got = from_slurm(DEFAULT, SRUN, set())
    assert (got.nnodes, got.rdzv_endpoint, got.rdzv_id) == ("2", f"gpu07:{BASE_PORT + 234}", "slurm-1234")
    assert got.nproc_per_node == DEFAULT.nproc_per_node and got.max_restarts == DEFAULT.max_restarts
    assert (
        summary(got, SRUN, set())
        == f"ptrun: SLURM job 1234: node 1 of 2, rendezvous at gpu07:{BASE_PORT + 234} (id slurm-1234)"
    )


def test_every_node_of_the_job_gets_the_same_layout():
    node0, node1 = (
        from_slurm(DEFAULT, {**SRUN, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i)}, set()) for i in (0, 1)
    )
    assert node0 == node1


def test_the_command_line_wins_field_by_field():
    explicit = explicit_fields(["recipe=digits_vit", "launcher.nnodes=1:2", "++launcher.rdzv_id=mine"])
    assert explicit == {"nnodes", "rdzv_id"}
    given = LauncherConfig(nnodes="1:2", rdzv_id="mine")  # what Hydra composed from those overrides
    got = from_slurm(given, SRUN, explicit)
    assert (got.nnodes, got.rdzv_endpoint, got.rdzv_id) == ("1:2", f"gpu07:{BASE_PORT + 234}", "mine")
    assert summary(got, SRUN, explicit).endswith("(launcher.nnodes, launcher.rdzv_id from the command line)")
    endpoint = LauncherConfig(rdzv_endpoint="head:5000")
    assert from_slurm(endpoint, SRUN, {"rdzv_endpoint"}).rdzv_endpoint == "head:5000"
    # a given endpoint is not looked for in SLURM's node list, which then cannot be in the way
    unlisted = {**SRUN, "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "n[1-", "MASTER_PORT": "x"}
    assert from_slurm(endpoint, unlisted, {"rdzv_endpoint"}) == replace(endpoint, nnodes="2", rdzv_id="slurm-1234")


def test_slurm_wins_over_a_recipe_or_preset():
    recipe = LauncherConfig(nnodes="4", rdzv_endpoint="elsewhere:1", nproc_per_node=8)  # not on the command line
    got = from_slurm(recipe, SRUN, explicit_fields(["recipe=vit_imagenet", "launcher=local"]))
    assert (got.nnodes, got.rdzv_endpoint, got.nproc_per_node) == ("2", f"gpu07:{BASE_PORT + 234}", 8)


def test_all_three_given_leaves_the_environment_unread():
    given = LauncherConfig(nnodes="2", rdzv_endpoint="h:1", rdzv_id="x")
    broken = {**SRUN, "SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_NODELIST": "n[1-"}
    assert from_slurm(given, broken, {"nnodes", "rdzv_endpoint", "rdzv_id"}) == given
    assert summary(given, broken, {"nnodes", "rdzv_endpoint", "rdzv_id"}) is None


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"PATH": "/usr/bin"},
        {"SLURM_JOB_ID": "1234", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"},  # salloc's shell: no task
    ],
)
def test_outside_a_slurm_task_the_config_is_unchanged(env):
    assert from_slurm(DEFAULT, env, set()) == DEFAULT
    assert summary(DEFAULT, env, set()) is None


def test_a_one_node_job_keeps_its_loopback_rendezvous():
    one = {
        **SRUN,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "gpu07",
        "SLURM_NODELIST": "gpu07",
        "SLURM_TASKS_PER_NODE": "1",
    }
    got = from_slurm(DEFAULT, one, set())
    assert (got.nnodes, got.rdzv_endpoint, got.rdzv_id) == ("1", "localhost:0", "slurm-1234")


def test_the_step_and_master_variables_come_first():
    # `srun -N3` inside a 4-node allocation, with MASTER_ADDR / MASTER_PORT exported by the batch script
    env = {
        **SRUN,
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_JOB_NODELIST": "gpu[05-08]",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_NODELIST": "gpu[06-08]",
        "SLURM_NNODES": "3",
        "SLURM_NODELIST": "gpu[06-08]",
    }
    got = from_slurm(DEFAULT, env, set())
    assert (got.nnodes, got.rdzv_endpoint) == ("3", f"gpu06:{BASE_PORT + 234}")
    got = from_slurm(DEFAULT, {**env, "MASTER_ADDR": "gpu06-ib", "MASTER_PORT": "31000"}, set())
    assert got.rdzv_endpoint == "gpu06-ib:31000"
    only_job = {k: v for k, v in SRUN.items() if k not in ("SLURM_NNODES", "SLURM_NODELIST")}
    assert from_slurm(DEFAULT, only_job, set()) == from_slurm(DEFAULT, SRUN, set())


def test_the_port_follows_the_job():
    ports = {read_job({**SRUN, "SLURM_JOB_ID": str(i)}).port for i in (1000, 1001, 2001, 999)}
    assert ports == {BASE_PORT, BASE_PORT + 1, BASE_PORT + 999}


@pytest.mark.parametrize(
    "var, value",
    [
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_TASKS_PER_NODE", "8(x2)"),
        ("SLURM_TASKS_PER_NODE", "1,2"),
    ],
)
def test_several_tasks_on_a_node_are_refused(var, value):
    env = {k: v for k, v in SRUN.items() if k not in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")}
    with pytest.raises(ConfigError) as e:
        from_slurm(DEFAULT, {**env, var: value}, {"nnodes"})
    assert str(e.value) == (
        f"{var}={value} is not allowed: 1 (ptrun runs one agent per node, which starts "
        f"launcher.nproc_per_node workers itself; submit with --ntasks-per-node=1)"
    )


def test_the_step_task_count_is_the_one_that_counts():
    # sbatch --ntasks-per-node=8 exports SLURM_NTASKS_PER_NODE=8; `srun --ntasks-per-node=1` runs one task a node
    env = {**SRUN, "SLURM_NTASKS_PER_NODE": "8", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert from_slurm(DEFAULT, env, set()).nnodes == "2"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not allowed: the job's number"),
        (
            {"SLURM_JOB_NUM_NODES": "two", "SLURM_NNODES": ""},
            "SLURM_JOB_NUM_NODES='two' is not allowed: the number of nodes, an integer >= 1",
        ),
        ({"SLURM_NNODES": "0"}, "SLURM_NNODES='0' is not allowed: the number of nodes, an integer >= 1"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not allowed: this node's index, 0 to 1 (SLURM_NNODES=2)"),
        (
            {"SLURM_JOB_NUM_NODES": "", "SLURM_NNODES": ""},
            "none of SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES is set",
        ),
        (
            {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""},
            "none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST is set",
        ),
        ({"SLURM_NODELIST": "gpu[07-08"}, "SLURM_NODELIST='gpu[07-08' is not allowed: a SLURM host list"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not allowed: a port 1-65535"),
        (
            {"SLURM_TASKS_PER_NODE": "x", "SLURM_NTASKS_PER_NODE": ""},
            "SLURM_TASKS_PER_NODE='x' is not allowed: task counts per node such as 1 or 1(x2)",
        ),
    ],
)
def test_a_malformed_environment_is_a_one_line_error(change, message):
    with pytest.raises(ConfigError) as e:
        from_slurm(DEFAULT, {**SRUN, **change}, set())
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_explicit_fields_reads_hydra_overrides():
    assert explicit_fields(
        [
            "launcher.nnodes=2",
            "+launcher.rdzv_endpoint=h:1",
            "~launcher.rdzv_id",
            "launcher=local",
            "launcher.nosuch=1",
            "train.epochs=1",
            "hydra.run.dir=x",
        ]
    ) == {"nnodes", "rdzv_endpoint", "rdzv_id"}


# ------------------------------------------------------------------------------------------ the command line


def slurm_env(**slurm: str) -> dict[str, str]:
    """This process's environment without any SLURM or torchrun variables it may run under, plus `slurm`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    return {**env, **slurm}


def test_ptrun_train_refuses_several_tasks_per_node(tmp_path):
    env = slurm_env(**{**SRUN, "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)"})
    out = subprocess.run(
        [sys.executable, "-m", "ptrun.cli", *command_args(("train", f"hydra.run.dir={tmp_path / 'run'}"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "ptrun: error: SLURM_NTASKS_PER_NODE=4 is not allowed: 1 (ptrun runs one agent per node, which starts "
        "launcher.nproc_per_node workers itself; submit with --ntasks-per-node=1)"
    ]
    assert not (tmp_path / "run").exists()


# Two nodes of one worker each, a few steps: the layout is what is tested, not training.
JOB = TINY + ["train.epochs=1", "train.max_steps_per_epoch=3", "launcher.nproc_per_node=1"]


@pytest.mark.slow
@pytest.mark.dist
def test_two_srun_tasks_form_one_job(tmp_path):
    """Two `ptrun train` agents, each given what srun gives node 0 / node 1 of job 4242 and no launcher.* key,
    meet at the first host's rendezvous and train as one 2-worker job, to the weights of a one-worker run.
    The host list names this machine by its hostname (a loopback name would be refused for a multi-node job:
    no other machine could reach it); the port is a free one, via MASTER_PORT."""
    run_dir, port, host = tmp_path / "job", free_port(), socket.gethostname()
    agents, logs = [], [tmp_path / f"node{i}.log" for i in (0, 1)]
    try:
        for node in (0, 1):
            env = slurm_env(
                SLURM_JOB_ID="4242",
                SLURM_JOB_NUM_NODES="2",
                SLURM_NNODES="2",
                SLURM_NODEID=str(node),
                SLURM_PROCID=str(node),
                SLURM_LOCALID="0",
                SLURM_JOB_NODELIST=f"{host},other-node",
                SLURM_NTASKS_PER_NODE="1",
                SLURM_TASKS_PER_NODE="1(x2)",
                MASTER_PORT=str(port),
            )
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ptrun.cli", *command_args(("train", *JOB, f"hydra.run.dir={run_dir}"))],
                    env=env,
                    stdout=open(logs[node], "w"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        for agent, log in zip(agents, logs, strict=True):
            assert agent.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)

    for node, log in enumerate(logs):
        assert (
            f"ptrun: SLURM job 4242: node {node} of 2, rendezvous at {host}:{port} (id slurm-4242)"
            in log.read_text().splitlines()
        )
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e["world_size"] for e in events if e["event"] == "start"] == [2]

    # One worker on one machine trains the same job: the global batch, data order and loss do not depend on
    # the layout, so the weights agree up to the order of float sums (two half-batch gradients summed against
    # one full batch; measured 1.3e-6 after the 3 steps), while a step lost moves them by 5e-4 (measured).
    one = tmp_path / "one_worker"
    run_workers(JOB, one)
    got, want = final_params(run_dir), final_params(one)
    assert got.keys() == want.keys()
    drift = max((got[n] - want[n]).abs().max().item() for n in want)
    assert drift < 1e-5, drift
