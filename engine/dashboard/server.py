"""Running the dashboard: uvicorn on a socket bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from engine.dashboard.app import create_app
from engine.store.store import Store


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def make_server(store: Store, sock: socket.socket, token: str | None = None) -> tuple[uvicorn.Server, str]:
    """A uvicorn server for the dashboard of ``store`` on ``sock`` and its resend token; run it with
    ``server.run(sockets=[sock])``, stop it with ``server.should_exit = True``."""
    host = sock.getsockname()[0]
    hosts = ["127.0.0.1", "localhost", host] + (["*"] if host in ("0.0.0.0", "::") else [])
    app = create_app(store, token=token, allowed_hosts=hosts)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    return uvicorn.Server(config), str(app.state.dashboard.token)


def serve(
    store: Store, host: str = "127.0.0.1", port: int = 8765, ready: Callable[[str, str], None] | None = None
) -> None:
    """Serve the dashboard until Ctrl-C or SIGTERM; ``ready(address, token)`` is called once it is
    bound (the address is a URL; the token is what a resend needs)."""
    sock = bind(host, port)
    server, token = make_server(store, sock)
    address = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}/"
    if ready is not None:
        ready(address, token)
    server.run(sockets=[sock])
