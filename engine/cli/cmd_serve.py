"""``mq serve``: RocketMQ's wire protocol over the store (a name server and a broker endpoint), so
unmodified RocketMQ clients produce and consume (see :mod:`engine.remoting`); with ``--qmq`` also
QMQ's (a meta-server locator over HTTP, a meta server and a broker: :mod:`engine.qmq`); with
``--grpc`` also RocketMQ 5's gRPC ``MessagingService`` (the 5.x clients: :mod:`engine.grpc`)."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from engine.cli.common import EXIT_OK, Output, int_at_least, open_store
from engine.collector import tune_for_serving

SIGNAL_POLL_S = 0.5
"""Longest a stop signal taken by another thread waits for the main thread to handle it."""


def _serve(args: argparse.Namespace, out: Output) -> int:
    from engine.remoting import RemotingServer

    store = open_store(args)
    server = RemotingServer(
        store,
        host=args.host,
        namesrv_port=args.namesrv_port,
        broker_port=args.broker_port,
        advertised_host=args.advertised_host,
        auto_create_topics=args.auto_create_topics,
        run_broker_jobs=not args.no_broker_jobs,
        broker_jobs_process=not args.broker_jobs_in_thread,
    ).start()
    qmq = None
    if args.qmq:
        from engine.qmq import QmqServer

        try:
            qmq = QmqServer(
                store,
                host=args.host,
                http_port=args.qmq_http_port,
                meta_port=args.qmq_meta_port,
                broker_port=args.qmq_broker_port,
                advertised_host=args.advertised_host,
                auto_create_topics=args.auto_create_topics,
            ).start()
        except BaseException:
            server.stop()
            raise
    grpc_door = None
    if args.grpc:
        from engine.grpc import GrpcServer

        try:
            grpc_door = GrpcServer(
                store, host=args.host, port=args.grpc_port, advertised_host=args.advertised_host
            ).start()
        except BaseException:
            if qmq is not None:
                qmq.stop()
            server.stop()
            raise
    ready: dict[str, object] = {
        "namesrv": server.namesrv_address,
        "broker": server.broker_address,
        "store": store.root,
        "broker_jobs": not args.no_broker_jobs,
    }
    text = f"mq serve: name server {server.namesrv_address}, broker {server.broker_address}"
    if qmq is not None:
        ready |= {
            "qmq_meta_server": qmq.meta_server_url,
            "qmq_meta": qmq.meta_address,
            "qmq_broker": qmq.broker_address,
        }
        text += f"; QMQ meta server {qmq.meta_server_url} ({qmq.meta_address}), broker {qmq.broker_address}"
    if grpc_door is not None:
        ready["grpc"] = grpc_door.address
        text += f"; RocketMQ 5 gRPC {grpc_door.address}"
    tune_for_serving()  # started: what start-up made is kept out of every later collection
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        # Before the ready line: a supervisor may send SIGTERM as soon as it reads it, and the
        # default action would end the server without stopping the doors and the broker process.
        signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        out.emit(ready, f"{text} (store {store.root}); Ctrl-C stops it")  # a closed stdout stops it too
        # Waited for in slices: a signal the kernel hands to another thread runs its Python handler
        # (or raises KeyboardInterrupt) only once the main thread runs again, and a wait without a
        # timeout never returned then (a SIGTERM left `mq serve` running until killed).
        while not done.wait(SIGNAL_POLL_S):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if grpc_door is not None:
            grpc_door.stop()
        if qmq is not None:
            qmq.stop()
        server.stop()
    return EXIT_OK


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``serve`` to ``commands``."""
    serve = commands.add_parser(
        "serve", parents=[common], help="speak RocketMQ's wire protocol (name server + broker) over the store"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--namesrv-port", type=int_at_least(0), default=9876, help="name server port (default 9876; 0 = any)"
    )
    serve.add_argument(
        "--broker-port", type=int_at_least(0), default=10911, help="broker port (default 10911; 0 = any)"
    )
    serve.add_argument(
        "--advertised-host", default=None, help="broker host told to clients (default: --host)"
    )
    serve.add_argument(
        "--auto-create-topics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="create a topic on its first send, as RocketMQ's autoCreateTopicEnable "
        "(default: engine.toml's auto_create_topics, true); --no-auto-create-topics: TOPIC_NOT_EXIST",
    )
    serve.add_argument(
        "--no-broker-jobs",
        action="store_true",
        help="do not run the broker's jobs (dispatch, schedule, retry, ...) in-process (the Spark jobs do)",
    )
    serve.add_argument(
        "--broker-jobs-in-thread",
        action="store_true",
        help="run the broker's jobs on a thread of the server's process, not in a process of their own",
    )
    serve.add_argument(
        "--qmq",
        action="store_true",
        help="also speak QMQ's protocol: a meta-server locator (HTTP /meta/address), meta server, broker",
    )
    serve.add_argument(
        "--qmq-http-port",
        type=int_at_least(0),
        default=8080,
        help="QMQ meta-server locator port, the clients' metaServer URL (default 8080; 0 = any)",
    )
    serve.add_argument(
        "--qmq-meta-port",
        type=int_at_least(0),
        default=20880,
        help="QMQ meta server port (default 20880; 0 = any)",
    )
    serve.add_argument(
        "--qmq-broker-port",
        type=int_at_least(0),
        default=20881,
        help="QMQ broker port (default 20881; 0 = any)",
    )
    serve.add_argument(
        "--grpc",
        action="store_true",
        help="also speak RocketMQ 5's gRPC MessagingService (the 5.x clients' proxy protocol)",
    )
    serve.add_argument(
        "--grpc-port",
        type=int_at_least(0),
        default=8081,
        help="RocketMQ 5 gRPC port, the 5.x clients' endpoints (default 8081 as the proxy's; 0 = any)",
    )
    serve.set_defaults(func=_serve)
