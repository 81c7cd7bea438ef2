"""The rendezvous endpoint, checked before a launch: it parses, its host resolves, and a one-machine job can host
its store on the port (torch would otherwise wait on a busy port until the rendezvous times out, or print pages of
stack frames for a host that does not resolve)."""

from __future__ import annotations

import os
import socket

from ptrun.config import ConfigError, LauncherConfig, parse_nnodes

DEFAULT_RDZV_PORT = 29400  # torch's c10d default when the endpoint names no port


def check_rendezvous(lc: LauncherConfig) -> None:
    """`launcher.rdzv_endpoint` must parse, its host resolve, and a one-machine job must be able to host its
    rendezvous store (that a job of several machines names an endpoint and id they can share was checked when
    the config was resolved: `ptrun.config.check_machines`).
    torch otherwise takes a busy local port for another agent's store, connects to whatever holds it and
    waits there until the rendezvous times out (a hang, not an error). Jobs of several machines may share the
    port with an agent of the same job on this machine, so only one-machine jobs are checked."""
    # inner import: start-up (torch)
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

    try:
        host, port = parse_rendezvous_endpoint(lc.rdzv_endpoint, default_port=DEFAULT_RDZV_PORT)
    except ValueError:
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r} is not allowed: host:port with a port "
            f"0-65535 (localhost:0 picks a free one)"
        ) from None
    # A host that does not resolve makes torch retry inside its C++ store client until the join timeout and
    # then print pages of stack frames; every machine of the job needs the name, this one included.
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) else "not a valid host name"
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r}: host {host!r} does not resolve "
            f"({reason}); use a host name or address every machine resolves, or localhost:0 "
            f"for one machine"
        ) from None
    if parse_nnodes(lc.nnodes)[1] > 1 or port == 0 or not _matches_machine_hostname(host):
        return
    # Listen on every address, as the store will (create_server sets SO_REUSEADDR like the store does: a port
    # a finished run left in TIME_WAIT is free, one another process listens on is not).
    dual = socket.has_dualstack_ipv6()
    try:
        socket.create_server(
            ("", port), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        ).close()
    except OSError as e:
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r}: port {port} is not free on this machine "
            f"({os.strerror(e.errno)}); choose a free port, or localhost:0 for any"
        ) from None
