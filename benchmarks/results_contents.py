"""What docs/results.md and the README's results blocks show: an entry for every result (`TABLES`), the
machine and date of results whose JSON names none, the other result files, and the README blocks. The prose
around each result (what it measures, what it says) is its template, docs/results/templates/NAME.md for
docs/results/NAME.json. `benchmarks.results_page` writes the files from these entries, the templates and the
JSON in docs/results/; a new result file needs its entry here and its template there."""

from __future__ import annotations

from benchmarks.results_entry import Table

MACHINE = "2 CPU cores, no GPU (a shared VM; the workers are processes on emulated devices, gloo)"
"""The machine of a result whose JSON names none (its `machine` key) and that `MACHINES` does not list."""

MACHINES = {
    "bench_pipeline.json": MACHINE + "; a slower VM than the other results', about 3x per training step",
}
"""JSON file -> its machine, where it differs from `MACHINE`."""

MEASURED = {
    "bench_cache.json": "2026-11-22",
    "bench_memory.json": "2026-11-24",
    "bench_memory_growth.json": "2026-11-28",
    "bench_peers_bbc_news_bert.json": "2026-11-25",
    "bench_peers_digits_vit.json": "2026-11-24",
    "bench_peers_digits_vit_seeds.json": "2026-11-25",
    "bench_peers_digits_vit_engine.json": "2026-11-26",
    "bench_peers_bbc_news_bert_seeds.json": "2026-11-27",
    "bench_peers_bbc_news_bert_policies.json": "2026-11-25",
    "bench_peers_causal_lm.json": "2026-11-25",
    "bench_peers_bbc_news_lora.json": "2026-11-29",
    "bench_peers_bbc_news_lora_cache_depth.json": "2026-11-29",
    "bench_peers_bbc_news_lora_cache_2_blocks.json": "2026-11-29",
    "bench_peers_bbc_news_lora_seeds.json": "2026-11-29",
    "bench_peers_bbc_news_lora_5_epochs.json": "2026-11-29",
    "bench_peers_causal_lm_lora.json": "2026-11-29",
    "bench_pipedream.json": "2026-11-22",
    "bench_pipedream_placement.json": "2026-11-22",
    "bench_pipeline.json": "2026-11-25",
    "bench_speedup.json": "2026-11-22",
    "bench_speedup_bert.json": "2026-11-22",
    "sweep_alpha.json": "2026-11-22",
    "sweep_interval_bbc_news_bert.json": "2026-11-24",
    "sweep_interval_digits_vit.json": "2026-11-24",
    "sweep_microbatches.json": "2026-11-22",
    "validate_simulator_bench3_original.json": "2026-11-22",
    "validate_simulator_bench3_rerun.json": "2026-11-22",
}
"""JSON file -> the date it was measured, for JSON without a `date` key: the date of the last commit that
changed its measurement (`git log -1 --format=%ad --date=short -- docs/results/FILE`, passing over commits that
only rewrote the commands it records). A re-measured file gets its new date here; `tests/test_readme_results.py`
compares this table with git's history."""

TABLES = [
    Table("bench_peers_bbc_news_bert.json", "benchmarks.peers", "ptrun against plain PyTorch: bbc_news_bert"),
    Table(
        "bench_peers_bbc_news_bert_seeds.json",
        "benchmarks.peers",
        "The embedded default against the plain loop over three seeds",
    ),
    Table(
        "bench_peers_digits_vit_engine.json",
        "benchmarks.peers",
        "The engine on millisecond steps: digits_vit with freezing off, before and after the step's restructuring",
    ),
    Table("bench_peers_digits_vit.json", "benchmarks.peers", "ptrun against plain PyTorch: digits_vit"),
    Table(
        "bench_peers_bbc_news_bert_policies.json",
        "benchmarks.peers",
        "Freeze policies on the embedded default over three seeds",
    ),
    Table("bench_peers_digits_vit_seeds.json", "benchmarks.peers", "digits_vit over five seeds: its freeze schedule"),
    Table("bench_peers_causal_lm.json", "benchmarks.peers", "ptrun against plain PyTorch: causal_lm", optional=True),
    Table(
        "bench_peers_bbc_news_lora.json",
        "benchmarks.peers",
        "LoRA: bbc_news_lora against peft with the HF Trainer and in the plain loop, over three seeds",
    ),
    Table(
        "bench_peers_bbc_news_lora_cache_depth.json",
        "benchmarks.peers",
        "LoRA's cache threshold: from the first frozen block against the default, bbc_news_lora",
    ),
    Table(
        "bench_peers_bbc_news_lora_cache_2_blocks.json",
        "benchmarks.peers",
        "LoRA caching from two frozen blocks: bbc_news_lora against the same peers and ptrun with freezing off",
    ),
    Table(
        "model_step_bbc_news_lora.json",
        "benchmarks.model_step",
        "LoRA's step: ptrun's units against peft's model, bbc_news_lora",
    ),
    Table(
        "bench_peers_bbc_news_lora_seeds.json",
        "benchmarks.peers",
        "LoRA before the one-kernel sum: two seeds, and two other freeze rules",
    ),
    Table(
        "bench_peers_bbc_news_lora_5_epochs.json",
        "benchmarks.peers",
        "LoRA over 5 epochs at alpha 1/3: bbc_news_lora against the same peers, over three seeds",
    ),
    Table(
        "bench_peers_causal_lm_lora.json",
        "benchmarks.peers",
        "LoRA on a decoder: causal_lm adapter=lora against the plain peft loop",
    ),
    Table(
        "bench_startup_text_classification.json",
        "benchmarks.startup",
        "Start-up: process start to the first step, text_classification",
        optional=True,
    ),
    Table(
        "bench_startup_bbc_news_bert.json",
        "benchmarks.startup",
        "Start-up: process start to the first step, bbc_news_bert",
        optional=True,
    ),
    Table("bench_compile.json", "benchmarks.compiled", "Compiled units against eager on the CPU", optional=True),
    Table(
        "bench_compile_auto.json",
        "benchmarks.compile_auto",
        "train.compile=auto against false and true on the CPU",
        optional=True,
    ),
    Table(
        "bench_overhead_bbc_news_bert_small.json",
        "benchmarks.overhead",
        "ptrun against a loop frozen by hand: tiny model, steps of milliseconds",
        optional=True,
    ),
    Table(
        "bench_overhead_bbc_news_bert_normal.json",
        "benchmarks.overhead",
        "ptrun against a loop frozen by hand: bbc_news_bert",
        optional=True,
    ),
    Table("bench_peers_bbc_news_bert_gpu.json", "benchmarks.peers", "On one GPU: bbc_news_bert at 128 tokens"),
    Table("bench_peers_bbc_news_bert_512_gpu.json", "benchmarks.peers", "On one GPU: bbc_news_bert at 512 tokens"),
    Table("bench_peers_digits_vit_gpu.json", "benchmarks.peers", "On one GPU: digits_vit"),
    Table("bench_peers_causal_lm_gpu.json", "benchmarks.peers", "On one GPU: causal_lm"),
    Table(
        "model_step_bbc_news_bert_512.json",
        "benchmarks.model_step",
        "The model's own step: ptrun's units against the library's model, bbc_news_bert at 512 tokens",
    ),
    Table(
        "model_step_bbc_news_bert_512_gpu.json",
        "benchmarks.model_step",
        "On one GPU: the model's own step at 512 tokens",
        optional=True,
    ),
    Table(
        "check_savings_bbc_news_bert_gpu.json",
        "benchmarks.savings_check",
        "The savings line against a run without freezing: bbc_news_bert on a GPU",
        optional=True,
    ),
    Table(
        "check_savings_bbc_news_bert.json",
        "benchmarks.savings_check",
        "The savings line against a run without freezing: bbc_news_bert and digits_vit, 2 workers",
        optional=True,
    ),
    Table(
        "check_savings_digits_vit.json", "benchmarks.savings_check", "The same: digits_vit, 2 workers", optional=True
    ),
    Table(
        "check_savings_text_classification_320.json",
        "benchmarks.savings_check",
        "The savings line against a run without freezing: text_classification",
        optional=True,
    ),
    Table(
        "check_savings_text_classification.json",
        "benchmarks.savings_check",
        "The savings line when too few steps trained every layer: text_classification, 80 articles a topic",
        optional=True,
    ),
    Table("sweep_interval_bbc_news_bert.json", "benchmarks.sweep_interval", "Freezing inside an epoch: bbc_news_bert"),
    Table("sweep_interval_digits_vit.json", "benchmarks.sweep_interval", "Freezing inside an epoch: digits_vit"),
    Table("bench_memory.json", "benchmarks.memory", "Memory a worker holds"),
    Table("bench_lora_memory.json", "benchmarks.lora_memory", "Memory a worker holds with LoRA"),
    Table(
        "check_lora_export.json",
        "benchmarks.export_check",
        "The LoRA export, loaded without ptrun",
        optional=True,
    ),
    Table(
        "lora_continue.json",
        "benchmarks.lora_continue",
        "Continuing a LoRA adapter: bbc_news_lora 2 + 1 epochs against 3, over three seeds",
    ),
    Table("bench_memory_growth.json", "benchmarks.memory_growth", "Memory a worker holds as the model grows"),
    Table("bench_pipeline.json", "benchmarks.pipeline", "Pipeline bubble and data-parallel overhead"),
    Table(
        "bench_speedup.json", "benchmarks.speedup", "Speedup breakdown, digits_vit (the paper's Figure 9)", older=True
    ),
    Table("bench_speedup_bert.json", "benchmarks.speedup", "Speedup breakdown, bbc_news_bert", older=True),
    Table("sweep_alpha.json", "benchmarks.sweep_alpha", "Freeze rate alpha (the paper's Figure 10)", older=True),
    Table(
        "sweep_microbatches.json", "benchmarks.sweep_microbatches", "Micro-batches (the paper's Figure 11)", older=True
    ),
    Table("bench_cache.json", "benchmarks.cache", "AutoCache", older=True),
    Table("bench_pipedream.json", "benchmarks.pipedream", "PipeDream against 1F1B", older=True),
    Table("bench_pipedream_placement.json", "benchmarks.pipedream", "PipeDream stage replication", older=True),
]
"""The results on the page, current and older each in this order."""

OTHER = {
    "cpu_costs_digits_vit.json": "the simulator's CPU profile of digits_vit",
    "validate_simulator_bench3_original.json": "the simulator against the speedup breakdown's runs",
    "validate_simulator_bench3_rerun.json": "the simulator against a re-run of the speedup breakdown",
}
"""JSON files used by `ptrun plan` and the simulator's validation, shown in [simulator.md](simulator.md)."""

README_BLOCKS = {"headline": "bench_peers_bbc_news_bert_seeds.json"}
"""README marker name -> the JSON file it quotes."""
