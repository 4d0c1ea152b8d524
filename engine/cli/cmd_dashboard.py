"""``mq dashboard``: the local web console (see :mod:`engine.dashboard`)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.common import EXIT_OK, Output, int_at_least, open_store


def _dashboard(args: argparse.Namespace, out: Output) -> int:
    from engine.dashboard.server import serve

    store = open_store(args)

    def ready(address: str, token: str) -> None:
        out.emit(
            {"url": address, "token": token, "store": store.root},
            f"mq dashboard on {address} (store {store.root}); Ctrl-C stops it",
            f"resend token: {token}",
        )

    serve(store, host=args.host, port=args.port, ready=ready)
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dashboard`` to ``commands``."""
    dashboard = commands.add_parser("dashboard", parents=[common], help="a local web console in the browser")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    dashboard.add_argument(
        "--port", type=int_at_least(0), default=8765, help="port (default 8765; 0 = any free)"
    )
    dashboard.set_defaults(func=_dashboard)
