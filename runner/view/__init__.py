"""`runner view`: a local web app over a run store (FileStore or PostgreSQL).

Pages: the runs list (filters, paging, totals), one run (transcript, per-turn chart, stop,
raw trace, Approve/Reject for a call that waits on a verdict), and the suite reports. A run
being driven by any process updates in place through server-sent events. It binds to
loopback by default; any other address needs a token, which every request must then carry.
Templates, script and style ship in this package (no CDN). See `runner.view.app` for the
routes and the security rules.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Callable

from runner.errors import UsageError
from runner.store import RunStore

__all__ = ["check_host", "is_loopback", "serve"]

TOKEN_ENV = "RUNNER_VIEW_TOKEN"


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token.

    Raises:
        UsageError: `host` is not loopback and `token` is empty.
    """
    if not is_loopback(host) and not token:
        raise UsageError(f"--host {host} is reachable from other machines: give --token TOKEN "
                         f"(or ${TOKEN_ENV}), which every request must then carry")


def serve(store: RunStore, runs_root: Path, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          poll_s: float = 0.25, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the view until SIGINT/SIGTERM (uvicorn's handlers), in this thread.

    Args:
        runs_root: the runs directory, for the suite reports.
        port: 0 picks a free one; `on_ready` is called with the base URL once it listens.
        poll_s: how often a live page checks the store for changes, seconds.

    Raises:
        UsageError: a non-loopback host without a token; the address cannot be bound.
    """
    import uvicorn

    from runner.view.app import ViewSettings, create_app

    check_host(host, token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    settings = ViewSettings(store=store, runs_root=runs_root, token=token or None, poll_s=poll_s)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=5))
    settings.stopping = lambda: bool(server.should_exit)
    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
    if on_ready is not None:
        on_ready(f"http://{shown}:{bound}/")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
