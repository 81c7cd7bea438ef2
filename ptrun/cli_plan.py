"""`ptrun plan ...`: a recipe's epochs projected onto a cluster without running them (ptrun/sim): the plans the
controller makes for each Figure-9 combination, estimated epoch times, and the speedups beside the paper's."""

from __future__ import annotations

from ptrun.cli_args import arguments, fail
from ptrun.compose import for_cluster
from ptrun.config import ConfigError, PtrunConfig


def _plan_config(overrides: list[str], cluster) -> PtrunConfig:
    """The recipe resolved for the cluster (`ptrun.compose.for_cluster`): its launcher sized to it, then
    validated against its world size; data and weight paths are not needed to plan, so they are not checked."""
    try:
        return for_cluster(overrides, nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node)
    except ConfigError as e:
        fail(str(e))


def run_plan(args: list[str]) -> None:
    """`ptrun plan ...` (see USAGE and ptrun/sim)."""
    # inner import: start-up
    from ptrun.costs.adapters import trained_params
    from ptrun.layout.fit import stage_bytes
    from ptrun.sim import costs_from_config, get_cluster, load_profile
    from ptrun.sim.report import report
    from ptrun.sim.simulate import default_samples, device_budget, fit_memory, plan_epochs, plannable, simulate

    overrides, cluster_name, cluster_keys, profile, samples = [], "paper", {}, None, None
    valued = {"--profile": "a value", "--samples": "a value"}
    for option, arg in arguments(args, "plan", valued, "--profile FILE, --samples N"):
        if option == "--profile":
            profile = arg
        elif option == "--samples":
            if not arg.isdigit() or int(arg) < 1:
                fail(f"--samples {arg} is not allowed: the number of training samples, an integer >= 1")
            samples = int(arg)
        elif arg.startswith("cluster="):
            cluster_name = arg.split("=", 1)[1]
        elif arg.startswith("cluster."):
            key, eq, value = arg[len("cluster.") :].partition("=")
            if not eq:
                fail(f"cannot parse '{arg}': cluster.FIELD=VALUE")
            cluster_keys[key] = value
        else:
            overrides.append(arg)
    try:
        cluster = get_cluster(cluster_name, cluster_keys)
        cfg = _plan_config(overrides, cluster)
        costs = costs_from_config(cfg.model, cfg.data)
        if profile is not None:
            costs = load_profile(profile, costs)
        samples = (
            samples
            or default_samples(cfg)
            or fail(
                f"--samples N is needed: the training-set size of data.name={cfg.data.name} is not known before it is "
                f"tokenized (a run's start event names it: train_samples)"
            )
        )
        results = simulate(costs, cluster, cfg, samples)
        policy = plannable(cfg).freeze
        first = plan_epochs(costs, cluster, cfg)[0].first
        resolved = plannable(cfg, costs, cluster)
        need = stage_bytes(fit_memory(costs, resolved), first, resolved.train.global_batch_size)
    except ConfigError as e:
        fail(str(e))
    work = (
        f"{sum(costs.fwd_flops) / 1e9:.1f} GFLOP forward a sample"
        if costs.fb_seconds is None
        else f"{sum(costs.fb_seconds) * 1e3:.2f} ms forward + backward a sample (profile {profile})"
    )
    trained = sum(trained_params(costs, cfg))
    trains = f" ({trained / 1e6:.2f} M trained: adapter={cfg.adapter.name})" if trained != sum(costs.params) else ""
    print(
        f"recipe {cfg.recipe}: {cfg.model.name}, {costs.num_units} units, {sum(costs.params) / 1e6:.1f} M "
        f"parameters{trains}, {work}; {samples:,} samples x {cfg.train.epochs} epochs; freeze.policy={policy.policy} "
        f"(alpha {policy.alpha:.3g}); auto.batch={cfg.auto.batch}"
    )
    print(
        f"cluster {cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} devices at "
        f"{cluster.flops / 1e12:.3g} TFLOP/s achieved ({cluster.efficiency:.0%} of {cluster.peak_tflops:g}), "
        f"links {cluster.intra_gbs:g} / {cluster.inter_gbs:g} GB/s intra / inter, host {cluster.host_gbs:g} GB/s, "
        f"RAM {cluster.host_memory_gb:g} GB + disk {cluster.disk_gbs:g} GB/s a node, "
        f"{cluster.transition_s:g} s a layout change"
    )
    gib = 2**30
    print(
        f"memory a device, first layout (K = {first.pp}, M = {first.microbatches}): "
        + ", ".join(f"stage {i} ~{b / gib:.2f} GiB" for i, b in enumerate(need))
        + f" (parameters, gradients, optimizer state, activations in flight) of "
        f"{device_budget(resolved, cluster) / gib:.1f} GiB\n"
    )
    print(report(cfg.recipe, results))
