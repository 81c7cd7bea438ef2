"""Topology-free checkpoints: parameters and optimizer state keyed by the library model's own parameter
names, so a checkpoint written under one Plan (any K, DP width, world size) loads under any other.

Layout of `run_dir/checkpoints/step_NNNNNNNN/`:
  params-stageS.safetensors   the parameters of stage S's units (written by the stage's replica 0)
  optim-stageS.pt             {param name: {state name: tensor}} (loaded with weights_only=True)
  rng-rankR.safetensors       rank R's random number generator states (restored when the world size is the same)
  progress.safetensors        a mid-epoch checkpoint's partial epoch sums (sample uses, gradient norms, loss)
  trainer.json                progress (epoch, step in epoch, global step), the plan, the model's identity
  manifest.json               sha256 and size of every file above; written last
The directory is assembled under a `.tmp` name and renamed into place once complete, so a crash mid-write
leaves no half checkpoint behind; a checkpoint whose files do not match its manifest is skipped with a
warning in favour of the previous one.

Three modules, one job each:
  lookup.py        finding and verifying checkpoints on disk, without torch (the launcher checks a run
                   directory before anything heavy is imported)
  store.py         writing and reading one checkpoint's files
  checkpoints.py   a worker's checkpoints (`Checkpoints`, the trainer's part): when one is due, what this rank
                   writes, resuming into any layout, how many are kept, and the model exported at the end
"""
