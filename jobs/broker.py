"""Every broker job in one Spark application: ``./spark-submit.sh jobs/broker.py [--once] [--jobs ...]``.

The app is :mod:`engine.spark.jobs.broker_app`; the jobs it runs are those of
:mod:`engine.spark.jobs.registry`.

With ``--serve`` the app also serves RocketMQ's wire protocol (:mod:`engine.remoting`: a name server
on ``--namesrv-port``, default 9876, and a broker on ``--broker-port``, default 10911, bound to
``--host``, default 127.0.0.1) while the jobs run; the endpoint leaves dispatch and the other broker
work to the Spark jobs.
"""

import argparse
import sys
from collections.abc import Sequence

from engine.spark.jobs.broker_app import main as _broker_main
from engine.spark.jobs.broker_app import run_forever, run_once
from engine.spark.jobs.registry import JOB_ORDER

__all__ = ["JOB_ORDER", "main", "run_forever", "run_once", "serve_options"]


def serve_options(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``--serve`` and its options off the broker app's arguments (``--store`` is kept for both)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--namesrv-port", type=int, default=9876)
    parser.add_argument("--broker-port", type=int, default=10911)
    args, rest = parser.parse_known_args(list(argv))
    store_parser = argparse.ArgumentParser(add_help=False)
    store_parser.add_argument("--store", default=None)
    args.store = store_parser.parse_known_args(rest)[0].store
    return args, rest


def main(argv: Sequence[str] | None = None) -> int:
    """The broker app, with the RocketMQ endpoint beside it when ``--serve`` is given."""
    args, rest = serve_options(sys.argv[1:] if argv is None else argv)
    if not args.serve:
        return _broker_main(rest)
    from engine.remoting import RemotingServer
    from engine.store import Store

    server = RemotingServer(
        Store.open(args.store),
        host=args.host,
        namesrv_port=args.namesrv_port,
        broker_port=args.broker_port,
        run_broker_jobs=False,
    ).start()
    print(
        f"serving RocketMQ: name server {server.namesrv_address}, broker {server.broker_address}", flush=True
    )
    try:
        return _broker_main(rest)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
