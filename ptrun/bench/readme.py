"""What docs/results.md and the README's results blocks show: an entry for every result (`TABLES`), with
what it measures and the prose that explains it, the machine and date of results whose JSON names none, the
other result files, and the README blocks. `ptrun.bench.results_page` writes the files from these entries and
the JSON in docs/results/; a new result file needs its entry here."""

from __future__ import annotations

from ptrun.bench.entries import Table

MACHINE = "2 CPU cores, no GPU (a shared VM; the workers are processes on emulated devices, gloo)"
"""The machine of a result whose JSON names none (its `machine` key) and that `MACHINES` does not list."""

MACHINES = {
    "bench_pipeline.json": MACHINE + "; a slower VM than the other results', about 3x per training step",
}
"""JSON file -> its machine, where it differs from `MACHINE`."""

MEASURED = {
    "bench_cache.json": "2026-11-22",
    "bench_memory.json": "2026-11-24",
    "bench_peers_bbc_news_bert.json": "2026-11-25",
    "bench_peers_digits_vit.json": "2026-11-24",
    "bench_peers_digits_vit_seeds.json": "2026-11-25",
    "bench_peers_digits_vit_engine.json": "2026-11-26",
    "bench_peers_bbc_news_bert_seeds.json": "2026-11-27",
    "bench_peers_bbc_news_bert_policies.json": "2026-11-25",
    "bench_peers_causal_lm.json": "2026-11-25",
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
changed the file (`git log -1 --format=%ad --date=short -- docs/results/FILE`). A re-measured file gets its
new date here; `tests/test_readme_results.py` compares this table with git's history."""


OLDER = (
    "Measured before `pipe.length=auto` started the default recipe as data parallelism (K = 1) and before "
    "ptrun's K = 1 step became a plain DDP step: the default then started as a 2-stage pipeline with a slower "
    "step. Within a table the rows compare ptrun with ptrun and still hold; do not compare these times with "
    "the tables above."
)

TABLES = [
    Table(
        "bench_peers_bbc_news_bert.json",
        "ptrun.bench.peers",
        "ptrun against plain PyTorch: bbc_news_bert",
        "The packaged BERT fine-tune (all-MiniLM-L6-v2 on BBC News topics, 3 epochs) run five ways in one "
        "invocation: (a) `scripts/peers/plain_loop.py`, a plain transformers loop (fused AdamW, the recipe's "
        "batch, warm-up, schedule and clip, the same split and batch order) in one process using both cores; "
        "(b) the same script under `torchrun` with `DistributedDataParallel`, one process per emulated device; "
        "(c, d) ptrun with freezing off on the same processes; (e) ptrun's default for the recipe (freezing, "
        "AutoPipe, AutoDP, AutoCache). Wall time runs from process start to exit (imports, data, model, every "
        "epoch's evaluation, checkpoints, export); training time is the epochs' training loops only.",
        "ptrun's default finished 1.78x faster than the faster plain peer in wall time (1.89x in training "
        "time) and ended at 98.35% top-1 against the peers' 98.12%; it reached the peers' final accuracy "
        "after 81 s of training against their 176 s. With freezing off, ptrun's step keeps up with the plain "
        "loop (1.04x its samples/s on one worker, 1.03x plain DDP's on two), and its start-up (wall minus "
        "training) is within a second of the peers'. One round: each run takes 2-4 minutes on this machine. "
        "Measured on the BERT-only model path that the generic Hugging Face one (above) replaced.",
    ),
    Table(
        "bench_peers_bbc_news_bert_seeds.json",
        "ptrun.bench.peers",
        "The embedded default against the plain loop over three seeds",
        "`ptrun train` as shipped (the recipe `bbc_news_bert`) against the plain transformers loop (fused AdamW, "
        "the recipe's batch, warm-up, schedule and clip, the same split and batch order, one process using "
        "both cores) and ptrun with freezing off on the loop's process and threads, one seed a round "
        "(`train.seed=0..2`: split, head initialisation and batch order), on an otherwise idle machine.",
        "Over seeds 0-2 ptrun finished 2.54x faster than the plain loop in wall time (2.53-2.55x; 2.62x in "
        "training time) at a mean top-1 of 98.27% against the loop's 98.20%, and reached the loop's final "
        "accuracy after 91 s of training against its 259 s. Two things make it: freezing with AutoCache, and "
        "the last layer computing only the first token's row, the one the classification head reads (the "
        "guide's Models section). The second needs no freezing: with freezing off ptrun ran 1.14x the loop "
        "(1.10-1.15x) on the same process and threads. Outside training, ptrun took 5.4 s to the first step "
        "against 6.0 s, its evaluations 8.4 s against 23.1 s (AutoCache serves the eval split's frozen prefix "
        "too), the rest 1.4 s against 2.0 s; measuring the freeze policy's signal took 0.04% of the training "
        "time. With freezing off ptrun ends lower (mean 97.33%), as it did before the last-layer change (seed "
        "0: 97.65% then and now): it trains every layer, like the loop, from a head initialised by its own "
        "per-unit generator. The code before the change (25cf320) measured 1.93x (1.85-1.96x) the same day.",
    ),
    Table(
        "bench_peers_digits_vit_engine.json",
        "ptrun.bench.peers",
        "The engine on millisecond steps: digits_vit with freezing off, before and after the step's restructuring",
        "Where per-step overhead shows on a CPU: `digits_vit`'s steps take about 8 ms, as a real model's do on a "
        "GPU. The plain loop (`timm.create_model`, fused AdamW, the recipe's schedule and clip, one process using "
        "both cores) against ptrun with freezing and AutoCache off on one worker, and the same ptrun run from "
        "the code before its step was turned right side out (the runtime an iterator, one `train_step`, the "
        "position one `TrainState`: c37a0a8, its own checkout's venv, `--engine`), in five interleaved rounds "
        "on an otherwise idle machine.",
        "ptrun with freezing off kept the plain loop's samples/s (1.00x; 0.99-1.32x over the rounds, the "
        "one high round a slow spell of the plain loop's; an earlier measurement of the same pair found 0.87x, "
        "before the per-step clean-up); against its own code before the restructuring it ran 1.02x the "
        "samples/s (median of the rounds' ratios; 0.98-1.22x), at the same final top-1 (95.56% both: the same "
        "steps). Its start-up "
        "(wall minus training: imports, data, model, evaluation and export) stays about 1.3 s above the plain "
        "loop's, so by wall time it is 0.94x. A py-spy profile of such a run "
        "(`py-spy record --subprocesses`) puts 80% of `train_epoch` in the forward and backward passes, 17% in "
        "the fused AdamW step, and under 3% in ptrun's own per-step work (batches, the update's sync and clip, "
        "bookkeeping).",
    ),
    Table(
        "bench_peers_digits_vit.json",
        "ptrun.bench.peers",
        "ptrun against plain PyTorch: digits_vit",
        "The same five runs on `digits_vit`, a small ViT trained from scratch on scikit-learn's digits "
        "(20 epochs), with `timm.create_model` in the plain loop.",
        "With freezing off, ptrun's step is 0.97x the plain loop's samples/s on one worker and 0.99x plain "
        "DDP's on two. ptrun's default is only 1.02x the plain loop in wall time: the ViT trains from scratch "
        "and its freeze schedule cannot start before epoch 10 of 20, so half of the run trains every layer "
        "(deciding inside epochs does not move it: see the interval sweep). Its top-1 (93.89% against "
        "97.50%) lies within the spread of seeds on 360 held-out images (one image is 0.28 points): over "
        "`train.seed=0..3` the plain loop ended at 97.50, 95.00, 92.50 and 95.56%, ptrun's default at 93.89, "
        "96.11, 93.89 and 90.56% (means 95.1% and 93.6%: freezing half of a from-scratch run may cost about "
        "a point here). On a machine about 3x slower per step, two interleaved rounds of `python "
        "scripts/bench_peers.py --recipe digits_vit --only a,e --repeats 2` gave ptrun's default 1.13x the "
        "plain loop's wall time and 1.20x its training time: the slower the step, the larger the share that "
        "frozen blocks remove. These runs used the recipe's earlier freeze schedule (after epoch 8, at most 4 "
        "of 6 blocks); the seed sweep below replaced it.",
    ),
    Table(
        "bench_peers_bbc_news_bert_policies.json",
        "ptrun.bench.peers",
        "Freeze policies on the embedded default over three seeds",
        "The recipe's freeze rule (\"ptrun default\": the paper's rule at alpha 1/2, decided every quarter "
        "epoch) against AutoFreeze's rule decided every 10 steps at the 70th and the 50th percentile of the "
        "blocks' gradient-norm changes, and the plasticity rule (a block settles when its weight change per "
        "unit of learning rate, against a bfloat16 copy, falls below a share of its peak; `freeze.threshold`), "
        "each over `train.seed=0..2`. The plain loop's rounds are the three of the table \"The embedded "
        'default against the plain loop over three seeds" (the same seeds), read back with `--reuse`; every '
        "ptrun run was measured in this invocation on a quiet machine. The file was written by "
        "`bench_peers.py` as `bench_peers_bbc_news_bert.json`.",
        "No policy beat the recipe's rule at its accuracy, so it stays the default: 2.03x the plain loop in "
        "wall time at a mean top-1 of 98.27% (the loop's: 98.20%). AutoFreeze's rule at the 70th percentile "
        "ran 2.75x but lost a point (97.18%); at the median 2.34x and 0.6 points (97.57%). The plasticity rule "
        "at threshold 0.6 froze every block after the first epoch (2.68x, 97.57%); at 0.3 (seed 0 only) it "
        "froze nothing until the last quarter epoch (317 s wall, 97.65%). By the end of the first epoch the "
        "faster rules had frozen five blocks of six (AutoFreeze) or all six (plasticity), where the recipe's "
        "rule had frozen three and reached six only in the last quarter epoch: this fine-tune still gains from "
        "its upper blocks in the second epoch. The profile of the recipe's runs shows where the time goes: its "
        "epochs trained for 80, 47 and 19 s (21, 36 and 89 samples/s; the same on every seed) against the "
        "loop's 100 s each, so the first epoch, in which at most three blocks are frozen, is 55% of its "
        "training time. On that engine the schedule bounded the speedup (its ideal, frozen blocks costing "
        "nothing: 2.47x); computing only the row the head reads, added since, took the same schedule to 2.54x "
        "(the table over three seeds above). The plain loop's rounds here are that table's earlier ones.",
    ),
    Table(
        "bench_peers_digits_vit_seeds.json",
        "ptrun.bench.peers",
        "digits_vit over five seeds: its freeze schedule",
        "The ViT from scratch against the plain loop over `train.seed=0..4` (each round one seed: split, initial "
        "weights and batch order), to choose the recipe's `freeze.start` and `freeze.max_fraction` at the plain "
        'loop\'s accuracy: "ptrun default" is the schedule the recipe had before (start after epoch 8, at most 4 '
        "of 6 blocks), the other rows the candidates. The file was written by `bench_peers.py` as "
        "`bench_peers_digits_vit.json`.",
        "Read the accuracy, not the times: four other jobs shared the 2 cores during this run, and the plain "
        "loop's one process with two threads suffered most from it (184 samples/s against its 1,835 alone), "
        "so its times here are not the loop's. Over the five seeds the plain loop's mean top-1 was 94.78%. The "
        "old schedule lost 1.56 points (93.22%); starting after epoch 10 with at most 3 blocks lost 0.17 "
        "(94.61%), after epoch 12 with 3 blocks gained 0.33 (95.11%), after epoch 14 with 2 blocks 0.44 "
        "(95.22%). Among the ptrun runs, which shared the machine alike, the two 3-block schedules trained in "
        "about the same time (32.6 and 33.2 s, medians) and the 2-block one in 39.3 s: the recipe now starts "
        "after epoch 12 with at most 3 blocks, the fastest schedule whose mean top-1 is not below the plain "
        "loop's. Seeds move a single run's top-1 by several points on 360 held-out images (one image is 0.28 "
        "points), so only means over seeds decide here.",
    ),
    Table(
        "bench_peers_causal_lm.json",
        "ptrun.bench.peers",
        "ptrun against plain PyTorch: causal_lm",
        "The causal-LM recipe on a small random-weight Llama (4 layers, hidden 256, a WordPiece vocabulary of "
        "8,192 trained on the text) and 500 BBC News articles packed into blocks of 256 tokens, both written by "
        "`python -m ptrun.bench.decoder DIR`. The plain loop trains `AutoModelForCausalLM` on the library's own "
        "next-token loss over the real tokens, on the same blocks in the same order. The runs are compared on "
        "eval perplexity, where lower is better: the target is the plain peers' lowest. Each run trains 40 steps "
        "(`train.max_steps_per_epoch=40`, one epoch); the model and text came from `python -m "
        "ptrun.bench.decoder /tmp/lm`.",
        "With freezing off, ptrun's engine trained at 0.98x the plain loop's samples/s (0.96-1.00x over the "
        "rounds) and ended at the same perplexity to the last digit. Its start-up and end (wall minus "
        "training) cost 3 s more: the run also writes a checkpoint and exports the model. Before the token "
        "loss was computed over [tokens, vocabulary] rows, as transformers computes it, the same benchmark "
        "measured 0.79x (`train.max_steps_per_epoch=40`, three rounds): cross-entropy over a [batch, "
        "vocabulary, tokens] view ran three times slower, forward and backward.",
        optional=True,
    ),
    Table(
        "bench_startup_text_classification.json",
        "ptrun.bench.startup",
        "Start-up: process start to the first step, text_classification",
        "How long a user waits from typing the command to the first training step: the plain transformers "
        "loop against `ptrun train recipe=text_classification` (the packaged MiniLM on a news sample csv, "
        "`data.name=hf`), once with an empty tokenized-data cache (the first run on a file) and once with the "
        "cache that run filled (every later run), in interleaved rounds of a few steps each "
        "(`scripts/bench_startup.py`). Times run from spawning the command; ptrun's start event is written "
        "once its workers hold their data, model and first layout. The plain loop tokenizes on every run.",
        "With the cache warm ptrun reached its first step 0.8 s before the plain loop (0.7-1.4 s over the "
        "rounds); the first run on the file, which tokenizes it, level with the loop. Once the config is "
        "checked (0.3 s, without torch) the workers' server imports torch, the trainer and transformers while "
        "the launcher reads the user's file to refuse bad columns or labels (a refusal stops the server), "
        "imports elastic and forms the rendezvous. With the server started after that read and the launcher's "
        "own torch import, the warm start came 0.4 s after the loop's that day (1.9 s the day before).",
        optional=True,
    ),
    Table(
        "bench_startup_bbc_news_bert.json",
        "ptrun.bench.startup",
        "Start-up: process start to the first step, bbc_news_bert",
        "The same on the embedded default: the plain loop against `ptrun train` with the tokenized-data "
        "cache empty and warm (the packaged corpus is tokenized once into it).",
        "With the cache warm ptrun's first step came 0.8 s before the plain loop's (0.7-0.8 s over the "
        "rounds); the first run, which tokenizes, level with it. The launcher no longer imports torch before "
        "starting the workers' server (for its GPU count and rendezvous check): side by side, 4 rounds of "
        "`ptrun train recipe=bbc_news_bert train.epochs=1 train.max_steps_per_epoch=3` on each code, the start "
        "event moved from 6.4 to 5.5 s. Before the earlier start-up work (a unit profile at every start, the "
        "packaged corpus tokenized by every worker on every run) ptrun was 8.6 s behind the loop on "
        "text_classification.",
        optional=True,
    ),
    Table(
        "bench_compile.json",
        "ptrun.bench.compiled",
        "Compiled units against eager on the CPU",
        "`train.compile=true` (each unit compiled on its own with torch.compile, inductor on the CPU) against "
        "`train.compile=false`, in interleaved rounds: digits_vit as it is, the embedded default's recipe on the "
        "tiny random BERT of `ptrun.bench.overhead --mode small` (steps of tens of milliseconds), and the "
        "default itself (one round: its three runs hold the machine for six minutes). A compiled run starts "
        "once on an empty inductor cache (cold, every graph built: a first run on a machine) and once on the "
        "cache that run filled (warm: every later run of the same model). Compiling is the busiest worker's "
        "seconds from the epoch events: the first layout's before its first step, each transition's in it.",
        "On two CPU cores compiling loses in wall time on all three: cold, the two workers each build the same "
        "graphs (23-35 s) and the run takes 1.4x (the default) to 3.8x (the tiny model) as long; warm, "
        "loading them takes 2-3 s and the run still 1.06x to 1.3x as long, because inductor's CPU kernels did "
        "not make the steps faster here (training 0.91-0.99x of eager's): the matrix products, most of a "
        "step, run as aten's own kernels either way (three profiled steps of the tiny model called aten::mm "
        "159 times, eager and compiled alike; inductor fuses only what lies between them). Hence "
        "`train.compile=auto` is off on the CPU. The "
        "default compiled 15 graphs in all (4 unit kinds: each its trained and frozen variants, the first "
        "trained unit's and the one-row tail's) and nothing between its transitions; final top-1 is the same "
        "(digits_vit: one eval image apart). On a GPU, where a step is launch-bound, `scripts/gpu_check.sh` "
        "measures it.",
        optional=True,
    ),
    Table(
        "bench_overhead_bbc_news_bert_small.json",
        "ptrun.bench.overhead",
        "ptrun against a loop frozen by hand: tiny model, steps of milliseconds",
        "What ptrun's machinery costs where a step takes tens of milliseconds, as a real model's does on a "
        "GPU, so that fixed costs (layout changes, per-step work) show on the CPU: the embedded default's recipe "
        "on a tiny random BERT (4 layers, 64 wide, MiniLM's tokenizer; the same BBC News data, the same "
        "schedule mechanism) against an oracle loop: the plain transformers loop (`ptrun.bench.plain_loop`'s model,"
        " data, batches, fused AdamW, schedule and "
        "clip) on the same two processes and threads as ptrun (DDP over gloo, one thread each), which freezes "
        "the same units at the same steps: its schedule is read from the ptrun run's `plan` events, what a user "
        "who knew it could write by hand. A frozen unit's parameters stop requiring gradients (autograd then "
        "records nothing for the frozen prefix, as under `no_grad`) and leave the optimizer; DDP is wrapped "
        "again after each freeze; no cache. ptrun runs as shipped (AutoCache serves the frozen prefix) and "
        "with `auto.cache=false`, against the same oracle. Seconds are the epochs' training loops; the whole "
        "run adds the layout changes between epochs (ptrun's transitions, the oracle's re-wrap).",
        "As shipped, ptrun's training took 0.83x the oracle's over the whole run (0.80-0.88x over the rounds), "
        "0.57x in the third epoch, with 7-9 of 10 units frozen and served from AutoCache where the oracle runs "
        "the frozen prefix forward every step; with AutoCache off, 0.94x (0.86-0.96x; per epoch 0.92-0.94x): "
        "with steps of 20-40 ms its five layout changes and its per-step work cost less than the oracle's "
        "re-wrapping of DDP after each freeze. All three ended with the same last-epoch training loss "
        "(1.59756 both ptrun runs, 1.59749 the oracle): the same units froze at the same steps. The tiny random "
        "model barely learns at the recipe's learning rate (its loss stays near ln 5): this measures time, "
        "not accuracy.",
        optional=True,
    ),
    Table(
        "bench_overhead_bbc_news_bert_normal.json",
        "ptrun.bench.overhead",
        "ptrun against a loop frozen by hand: bbc_news_bert",
        "The same on the embedded default's own model (all-MiniLM-L6-v2), epochs capped at 24 steps "
        "(`train.max_steps_per_epoch=24`: decisions every 6 steps, so the schedule still freezes) to measure "
        "in minutes.",
        "As shipped, ptrun's training took 0.97x the oracle's (0.96-0.99x over the rounds; 1.00x, 0.98x and "
        "0.90x by epoch, the cache paying from the third, with 11-13 of 14 units frozen); with AutoCache off "
        "0.97x (0.97-0.98x): on MiniLM's steps of about 0.2 s its machinery, the cache's filling included, costs "
        "nothing measurable. Both ptrun runs froze the same units at the same steps in every round and ended "
        "with the same last-epoch training loss (0.3615); the oracle, following that schedule, ended at 0.3350. "
        "The plain loop and ptrun do not train step for step alike even without freezing (on the tiny model "
        "after 16 steps, both unfrozen, they ended 0.2% apart; likely their classifier heads' different random "
        "initial values): that the oracle froze the right units and dropped them from its optimizer is checked "
        "by `tests/test_bench_overhead.py`, not by the loss.",
        optional=True,
    ),
    Table(
        "bench_peers_bbc_news_bert_gpu.json",
        "ptrun.bench.peers",
        "On one GPU: bbc_news_bert at 128 tokens",
        "`scripts/gpu_check.sh` on one H100 (the host's own torch 2.11 and transformers 5.17): the plain "
        "transformers loop (fused AdamW, TF32, one process), ptrun with freezing off, and ptrun's default (one "
        "worker: `launcher.nproc_per_node=auto`), one round each. Training time is the epochs' loops.",
        "With freezing off ptrun trained 1.18x faster than the loop; its default 0.84x, at 98.35% top-1 against "
        "the loop's 98.12%. Measured after freezes that keep the layout became in-place (no process group "
        "created, nothing sent), before AutoCache kept a one-worker job's entries in the GPU's memory: every "
        "cached or cache-filling batch still went through host shared memory, a wait for the GPU per step. The "
        "code before in-place freezes ran the default at 0.68x on the same kind of GPU. In all four GPU runs "
        "here ptrun multiplied in full float32, the loop in TF32: no worker applied `device.tf32` (one does since).",
    ),
    Table(
        "bench_peers_bbc_news_bert_512_gpu.json",
        "ptrun.bench.peers",
        "On one GPU: bbc_news_bert at 512 tokens",
        "The same three runs with `data.max_length=512`.",
        "Freezing off 0.84x the loop, the default 0.57x (0.54x before in-place freezes), the same code as at "
        "128 tokens: the host-memory cache moves 4x the bytes a sample here, and at 512 tokens the matrices are "
        "large enough for the loop's TF32, which ptrun lacked (above), to count.",
    ),
    Table(
        "bench_peers_digits_vit_gpu.json",
        "ptrun.bench.peers",
        "On one GPU: digits_vit",
        "The small ViT trained from scratch (millisecond steps: per-step costs show), the same three runs.",
        "Freezing off 1.08x the loop, the default 1.11x; top-1 94.2% and 93.6% against the loop's 97.8% in this "
        "one round (the recipe's seed sweep on the CPU puts them level: `digits_vit over five seeds`).",
    ),
    Table(
        "bench_peers_causal_lm_gpu.json",
        "ptrun.bench.peers",
        "On one GPU: causal_lm",
        "The decoder path on the small random-weight Llama of `python -m ptrun.bench.decoder`, 40 steps an "
        "epoch: the plain transformers loop against ptrun with freezing off.",
        "0.90x the loop's training speed at the same perplexity; the decoder path ran on transformers 5.17, "
        "whose causal-mask function takes `past_key_values` where 5.24 takes `cache` (`ptrun/compat.py`).",
    ),
    Table(
        "model_step_bbc_news_bert_512.json",
        "ptrun.bench.model_step",
        "The model's own step: ptrun's units against the library's model, bbc_news_bert at 512 tokens",
        "Where a gap between ptrun and the plain loop lies: in the model or in the engine. One training step of "
        "the model alone (forward, cross-entropy, backward, fused AdamW) on the recipe's first batch, the "
        "library's `AutoModelForSequenceClassification` against ptrun's units built from the same modules, "
        "in interleaved rounds in one process (`python -m ptrun.bench.model_step`); with the operators each "
        "spends its time in. No runtime, feed, cache or freeze signal: a gap here is the model's.",
        "On the CPU, with every layer training, the units run 1.20x the library's speed: the last layer "
        "computes the first token's row only (the guide's Models section), so they spend 2.24 s a step in "
        "matrix products against the library's 2.57 s, and the rest in the same operators, the CPU's "
        "flash-attention kernel with the padding mask included (at 512 tokens 64% of the articles are "
        "shorter). `scripts/gpu_check.sh` runs the same on a GPU (`steps512`, both models with TF32), where the "
        "last run had ptrun with freezing off at 0.84x the loop at 512 tokens against 1.18x at 128, ptrun "
        "without TF32 and the loop with it.",
    ),
    Table(
        "model_step_bbc_news_bert_512_gpu.json",
        "ptrun.bench.model_step",
        "On one GPU: the model's own step at 512 tokens",
        "The same comparison on one GPU (`scripts/gpu_check.sh`, job `steps512`): the kernels each model runs.",
        optional=True,
    ),
    Table(
        "check_savings_bbc_news_bert_gpu.json",
        "ptrun.bench.savings_check",
        "The savings line against a run without freezing: bbc_news_bert on a GPU",
        "How true the line a run ends with is (`freezing saved ~X s: ... without freezing it would take ~Y s`), "
        "where it was found false: the embedded default on one H100, one worker. The recipe as shipped, whose "
        "estimate prices the samples it trained with units frozen at its own steady seconds per sample while "
        "every unit trained (the first step, the CUDA start-up, left out), against the same recipe with "
        "`auto.freeze=false auto.cache=false`, measured, in interleaved rounds (`scripts/check_savings.py`, run "
        "there as `python3 -m ptrun.bench.savings_check` from a wheel of this branch). The earlier estimate "
        "priced every sample at the first stretch's rate, the first step's CUDA warm-up included. The rate "
        "ratio compares the two runs' steady steps with every unit training.",
        "The earlier estimate said ~10.2 s without freezing (9.7-10.7 s), 97% above the 5.2 s measured, and so the "
        "line claimed a saving; the new one says 5.85 s (5.21-6.49 s), 13% above (+5% to +20%). And the line now "
        "tells the truth about the run: with freezing and AutoCache it trained 8.9 s against 5.2 s without "
        "(0.64-0.68x), so it ends `freezing cost ~3.0 s: training took 8.2 s, longer than the ~5.2 s it would take "
        "without freezing (0.64x)`. A MiniLM step takes ~15 ms on this GPU; the layout changes (0.1-0.9 s each) and"
        " the cache's work cost more than the frozen layers' backward passes saved. Where the estimate is off it is"
        " off by the runs' own difference: in round 0 the freezing run's steps with every unit training ran 1.27x "
        "slower than the other run's in the same epoch, and its estimate came out 20% high; in round 1 0.98x and "
        "5%. Two rounds: all that the GPU lease allowed.",
        optional=True,
    ),
    Table(
        "check_savings_bbc_news_bert.json",
        "ptrun.bench.savings_check",
        "The savings line against a run without freezing: bbc_news_bert and digits_vit, 2 workers",
        "The line's estimate against the recipe with `auto.freeze=false auto.cache=false`, the same 2 workers, in "
        "interleaved rounds on the held machine. bbc_news_bert's rate: 22 steps (27 unfrozen, 5 of them warm-up).",
        "+3% to +8% (median +5%), following the rate ratio (1.05-1.07). Freezing off, epochs took 68.8-70.3 s; in "
        "27-step epochs steps 6-27 ran 0.670 s a step against 0.623-0.662 s later: a ~4% warm-up tail within the "
        "later epochs' spread. With one steady stretch the line gives no range.",
        optional=True,
    ),
    Table(
        "check_savings_digits_vit.json",
        "ptrun.bench.savings_check",
        "The same: digits_vit, 2 workers",
        "digits_vit's rate: epochs 2-13 (1,080 steps). The range: the estimate at those epochs' slowest and "
        "fastest rates.",
        "-9% to +10.5% (median -4%), following the rate ratio (0.90, 0.96, 1.13); freezing off, epochs took "
        "1.02-1.38 s, later ones no faster. In round 2 the freezing run's epochs 2-6 took 1.35-1.50 s, later "
        "1.16-1.32 s: +10.5%. The range (±2-5%, the machine within the run) held none of the measured runs, "
        "other runs at other times; shared with other jobs, single rounds missed by -32% to +30%.",
        optional=True,
    ),
    Table(
        "check_savings_text_classification_320.json",
        "ptrun.bench.savings_check",
        "The savings line against a run without freezing: text_classification",
        "The same on `recipe=text_classification` with a tiny random BERT (4 layers, 64 wide; steps of tens of "
        "milliseconds) on the packaged news sample, 320 articles a topic (80 steps an epoch, decisions every "
        "20).",
        "With 20 steps before the first freeze and steps of ~30 ms, the estimate came within +4% of the "
        "measured runs (median; -1% to +6% over the rounds, rate ratios 0.97-1.06); the earlier estimate, which "
        "priced the first steps' warm-up in, within +7% (+3% to +10%). Measured earlier on the machine shared "
        "with other jobs the same check ranged -16% to +18%.",
        optional=True,
    ),
    Table(
        "check_savings_text_classification.json",
        "ptrun.bench.savings_check",
        "The savings line when too few steps trained every layer: text_classification, 80 articles a topic",
        "The same with 80 articles a topic (20 steps an epoch): the first decision, after 5 steps, froze "
        "units, so 4 steps after the first trained every unit.",
        "Here the line no longer estimates: every round ends `freezing: training took 4.1 s; too few steps trained "
        "every layer before the first froze (4 after the warm-up, fewer than 10) to estimate the time without "
        "freezing` (round 0's). The earlier estimate claimed 8.1 s (median; +51%, +30% to +130%) against 4.1 s "
        "measured: the 4 steps after the first still ran 1.2-2.4x slower than the steady steps of the run without "
        "freezing (the rate ratio), a warm-up of several steps that the records cannot tell from the steady rate "
        "(per-step times measured beside them: steps 2 to 7 up to 2x the steady step).",
        optional=True,
    ),
    Table(
        "sweep_interval_bbc_news_bert.json",
        "ptrun.bench.sweep_interval",
        "Freezing inside an epoch: bbc_news_bert",
        "PipeTransformer decides at epoch boundaries, so a 3-epoch fine-tune trains every layer for its whole "
        "first epoch. `freeze.every=0.25` decides four times an epoch. In one invocation: the plain loop, the "
        "recipe's ptrun job deciding every epoch, every half and every quarter epoch, AutoFreeze's rule every "
        "quarter epoch, and the paper's rule at faster freeze rates. \"Ideal\" is what the run's own freeze "
        "schedule could save if frozen layers cost nothing (from its plan events).",
        "At the paper's rate (alpha 1/3) the same rule went from 1.14x (every epoch) to 1.36x (every half) "
        "and 1.40x (every quarter epoch) at the plain loop's top-1 or above. The recipe now decides every "
        "quarter epoch at alpha 1/2 (`recipes/bbc_news_bert.yaml`): 1.64x here, top-1 98.59% against 98.12%. "
        "alpha 2/3 reached 2.23x but lost 0.71 points, so it is not the default. What separates a run from "
        "its ideal is work freezing does not shrink: start-up and shut-down, an evaluation every epoch, the "
        "epoch that fills the cache, and the embedding and head, which always train.",
    ),
    Table(
        "sweep_interval_digits_vit.json",
        "ptrun.bench.sweep_interval",
        "Freezing inside an epoch: digits_vit",
        "The same sweep on `digits_vit`, the ViT from scratch.",
        "digits_vit cannot freeze before epoch 10 of 20 (`freeze.start`), so the interval changes little: "
        "every variant ran within 0.96-0.99x of the plain loop, and the ideal moved only from 1.54x to 1.63x. "
        "The recipe keeps deciding at epoch boundaries. The spread of top-1 between the variants is the noise "
        "of 360 held-out images.",
    ),
    Table(
        "bench_memory.json",
        "ptrun.bench.memory",
        "Memory a worker holds",
        "BERT-base (random init) trained on 4 workers through two layout changes, with the current code and "
        "with the commit before a worker kept only the units its stages run, side by side "
        "(`scripts/bench_memory.py`).",
        "At K = 4 each worker holds 300-324 MiB of parameters and optimizer state (0.18-0.19x the 1,671 MiB "
        "of the whole model), and its resident memory is 1.1-1.3 GiB against 1.4-1.7 GiB before; most of "
        "what remains is the libraries every process loads (about 0.9 GiB). The peak over the run is "
        "1.40-1.43 GiB a worker against 2.43-2.78 GiB before: no worker ever holds the whole model. The two "
        "layout changes took 1.05 s and 0.12 s against 9.26 s and 3.46 s, and sent 855 and 90 MiB point to "
        "point instead of broadcasting every stage to every worker.",
    ),
    Table(
        "bench_pipeline.json",
        "ptrun.bench.pipeline",
        "Pipeline bubble and data-parallel overhead",
        "Training steps through ptrun's pipeline runtime on a small ViT at K = 2 for each schedule and "
        "micro-batch count M. Bubble = 1 - (M x the stage's own forward + backward time on one micro-batch) / "
        "step time, averaged over both stages. The second table runs K = 1 with DP = 2 against torch's "
        "`DistributedDataParallel`.",
        "The bubble follows (K-1)/(M+K-1) at M = 1 and 2; beyond that the micro-batches (8 or 4 samples) are so "
        "small that per-micro-batch overhead keeps it above the formula. Runs of this command spread widely "
        "on 2 cores: over five runs the bubble at M = 4 measured 0.18-0.35 (GPipe) and 0.22-0.41 (1F1B). At "
        "K = 1 ptrun's stage runs in torch's DDP, as the plain step does; what it adds is the gradient norm "
        "it computes every step. On 2 CPU cores these are shapes, not GPU numbers.",
    ),
    Table(
        "bench_speedup.json",
        "ptrun.bench.speedup",
        "Speedup breakdown, digits_vit (the paper's Figure 9)",
        "`digits_vit` in three interleaved rounds: the baseline without freezing and each combination "
        "of the paper's components; medians, with the range of the three speedups. Ideal speedup = the "
        "model's training FLOPs over its active units', summed over the run's epochs (what the freeze "
        "schedule allows if frozen units cost nothing); the paper's column is ViT-B/16 on ImageNet on 16 "
        "GPUs, for shape.",
        "The recipe freezes late (its from-scratch ViT needs 9 epochs before the bottom blocks settle) and at "
        "most 4 of 6 blocks, so its ideal speedup is 1.54x; all four components reached 1.72x. The ideal "
        "counts FLOPs only: packing the pipeline into K = 1 also removes its bubble and per-micro-batch "
        "overhead, so a share above 100% can be real, and noise adds to it. Without AutoDP the pipeline "
        'keeps its length, so "freeze + AutoPipe + AutoCache" moves boundaries and caches but cannot '
        "shorten the pipeline.",
        older=True,
    ),
    Table(
        "bench_speedup_bert.json",
        "ptrun.bench.speedup",
        "Speedup breakdown, bbc_news_bert",
        "The packaged BERT fine-tune, the baseline without freezing against all four components "
        "(`--only 'all four'`, one invocation; a baseline run took about 12 minutes then).",
        "Epoch 1 ran as the 2-stage pipeline; the paper's rule then froze 5 and 9 of the 14 units, served "
        "them from AutoCache and packed the rest into K = 1, DP = 2. That schedule's ideal is 1.50x; the "
        "measured speedup is above it because K = 1 also drops the pipeline's bubble. The paper's 2.10x "
        "(SQuAD, 16 GPUs) is beyond what three epochs allow when the first one trains everything. (The "
        "recipe has since moved to decisions inside epochs: see the interval sweep above.)",
        older=True,
    ),
    Table(
        "sweep_alpha.json",
        "ptrun.bench.sweep_alpha",
        "Freeze rate alpha (the paper's Figure 10)",
        "`digits_vit` with all four components at each of the paper's alphas, next to the baseline, "
        "same seed and data. `freeze.policy=alpha` (the closed form ceil(L (1 - (1 - alpha)^T)), counted from "
        "the recipe's `freeze.start`) makes the schedule a function of alpha alone; "
        "`freeze.max_fraction=1.0` lifts the recipe's cap of 4 of 6 blocks.",
        "Larger alphas freeze sooner and train faster, roughly as each schedule's ideal speedup rises, apart "
        "from single-run noise (the alpha = 1/5 run met a slow spell of the shared cores); accuracy stays at "
        "or above the baseline's up to alpha = 2/5 and falls below it at 1/2. That is Figure 10's shape at "
        "smaller speedups: this recipe trains from scratch and starts freezing at epoch 10 of 20.",
        older=True,
    ),
    Table(
        "sweep_microbatches.json",
        "ptrun.bench.sweep_microbatches",
        "Micro-batches (the paper's Figure 11)",
        "Training steps through ptrun's pipeline runtime at K = 2 and K = 1 (DP = 2) for M = K .. 6K "
        "micro-batches per replica batch, on the pipeline benchmark's model.",
        "At K = 2 every M from 2K up ran 11-21% faster than M = K, as the bubble shrinks, and gained little "
        "beyond M = 4 because each micro-batch's fixed costs grow with M. At K = 1 there is no bubble, and "
        "the counts lie within 7% of each other. `pipe.microbatches=auto` measures this in the job.",
        older=True,
    ),
    Table(
        "bench_cache.json",
        "ptrun.bench.cache",
        "AutoCache",
        "`digits_vit` on a fixed layout (K = 1, DP = 2), freezing one more block every 2 epochs, once "
        'without and once with the cache, in one invocation. "First" is the epoch that fills the cache (or '
        'advances it by the newly frozen block), "read" the next one.',
        "Both runs end with the same accuracy (the cache changes nothing in float32; this schedule freezes from "
        "epoch 2, so it measures speed, not accuracy). Row 0 runs the same code in both columns and still "
        "reads 1.40x: differences of that size are noise on 2 cores (the cache-less run goes first and pays "
        "the cold start).",
        older=True,
    ),
    Table(
        "bench_pipedream.json",
        "ptrun.bench.pipedream",
        "PipeDream against 1F1B",
        "`digits_vit` at K = 2: the recipe's 1F1B with M = 2 against `pipe.schedule=pipedream`, same "
        "seed and data, two interleaved rounds, medians (the machine was shared with other benchmarks).",
        "PipeDream runs the pipelined epochs faster (no bubble), but does not reach 1F1B's final accuracy in "
        'the same 20 epochs, so its time to that target is "never": trained from scratch with AdamW, the '
        "input stage's stale weights cost accuracy per epoch. With freezing, the prefix frozen at epochs "
        "10-11 holds the run at 90.6%. More in [pipedream.md](pipedream.md).",
        older=True,
    ),
    Table(
        "bench_pipedream_placement.json",
        "ptrun.bench.pipedream",
        "PipeDream stage replication",
        'PipeDream\'s "2-1" placement (`pipe.first_stage_replicas=2`) against K = 2 and the full 2 x 2 grid, '
        "without freezing.",
        "The replicated run and the 4-worker grid ended with the same eval loss to every digit, as the same "
        "arithmetic should. On 2 cores extra workers only share the same cores, so this measures what the "
        "placement costs here, not the speedup it gives when every worker has a device of its own.",
        older=True,
    ),
]

OTHER = {
    "cpu_costs_digits_vit.json": "the simulator's CPU profile of digits_vit",
    "validate_simulator_bench3_original.json": "the simulator against the speedup breakdown's runs",
    "validate_simulator_bench3_rerun.json": "the simulator against a re-run of the speedup breakdown",
}
"""JSON files used by `ptrun plan` and the simulator's validation, shown in [simulator.md](simulator.md)."""

README_BLOCKS = {"headline": "bench_peers_bbc_news_bert_seeds.json"}
"""README marker name -> the JSON file it quotes."""
