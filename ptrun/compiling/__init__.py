"""`train.compile`, one concept in one package: each unit compiled on its own with its frozen and no-grad
variants (`compiler.py`), inductor's cache checked before a compile (`inductor_cache.py`), whether compiling
pays, a pure function of three figures (`price.py`), this machine's measured compile and step times kept for the
next run (`kept_costs.py`), and a run's decisions made from them at its start and at each transition
(`in_run.py`). Below the runtimes, which run the compiled units."""
