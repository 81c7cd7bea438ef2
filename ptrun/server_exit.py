"""Imported last by the workers' forkserver (`ptrun.launch.start_worker_server`), which alone has `SERVER_ENV` in
its environment: when its launcher ends, the server ends at once, without the teardown of the libraries it
imported for the workers (torch and the model's library: 1.5 s on 2 CPU cores). The server holds the
launcher's stdout and stderr, which its workers write to, so a `ptrun train | tee` or a benchmark reading the
output waited that long after ptrun had exited. Its workers end as multiprocessing's children do, without
exit handlers: nothing registered here runs in them. Anywhere else, importing this does nothing."""

from __future__ import annotations

import atexit
import os

SERVER_ENV = "PTRUN_WORKER_SERVER"

if os.environ.get(SERVER_ENV) == "1":
    # Exit handlers run last-registered first: this one, registered after the libraries', ends the process
    # before theirs and before the modules are torn down (the server holds nothing that needs either).
    atexit.register(os._exit, 0)
