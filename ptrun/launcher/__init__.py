"""`ptrun train`'s launcher, from the command line to the workers' exit: the one pass that finishes the workers'
config (`start.py`), the launch through torch elastic and what its end means (`launch.py`), the rendezvous
endpoint checked before it (`rendezvous.py`), the workers' forkserver and environment (`worker_server.py`),
ptrun's elastic agent (`elastic_agent.py`) and its watch for a worker the kernel killed for want of memory
(`oom_watch.py`), the worker entry (`worker.py`), the process lifetime (`lifeline.py`: nothing outlives the
launcher; `leftovers.py`: the next launch's sweep of what a killed one left), and the keys that would fit after
a worker ran out of memory (`memory_advice.py`).

Imported by the command (`ptrun.cli_train`) where each step needs it, so `ptrun --help` imports none of it and a
refused config no torch; this file imports nothing, since the workers' server preloads its modules by name."""
