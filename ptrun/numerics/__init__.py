"""The arithmetic of an update, the same under every layout: the optimizer and its learning-rate schedule
(`optim.py`, the `optim` group) and the compute precision with fp16's loss scale (`precision.py`,
`train.precision`). It reads only the config, so the compiled units, the runtimes, AutoCache and the trainer
all build on it."""
