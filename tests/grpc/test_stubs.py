"""The gRPC door's committed stubs (engine/grpc/v2) are what bin/gen-grpc-stubs.sh makes from the
committed protos (engine/grpc/protos), byte for byte: a proto changed without regenerating, or a
generated file edited by hand, fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "engine/grpc/v2"


def test_the_committed_stubs_are_what_the_protos_generate(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "bin/gen-grpc-stubs.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in STUBS.iterdir() if p.name != "__pycache__")
    assert generated == committed
    for name in generated:
        assert (tmp_path / name).read_bytes() == (STUBS / name).read_bytes(), name


def test_the_stubs_name_every_call_of_rocketmq_5s_messaging_service() -> None:
    from engine.grpc.v2 import service_pb2

    methods = {m.name for m in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods}
    assert {
        "QueryRoute",
        "Heartbeat",
        "SendMessage",
        "QueryAssignment",
        "ReceiveMessage",
        "AckMessage",
        "ChangeInvisibleDuration",
        "Telemetry",
        "NotifyClientTermination",
        "EndTransaction",
        "ForwardMessageToDeadLetterQueue",
    } <= methods


BOTH = """
import {first}, {second}
from engine.grpc import GrpcServer
from engine.grpc.v2 import definition_pb2 as ours
from rocketmq import Message, Producer
from rocketmq.grpc_protocol import definition_pb2 as theirs

message = ours.Message(body=b"x")
message.system_properties.born_timestamp.FromMilliseconds(1234)
read = theirs.Message.FromString(message.SerializeToString())
assert (read.body, read.system_properties.born_timestamp.ToMilliseconds()) == (b"x", 1234)
assert ours.Message.DESCRIPTOR.file.pool is not theirs.Message.DESCRIPTOR.file.pool
print("ok")
"""


@pytest.mark.parametrize(("first", "second"), [("engine.grpc", "rocketmq"), ("rocketmq", "engine.grpc")])
def test_the_door_and_the_official_client_import_in_one_process(first: str, second: str) -> None:
    # A fresh interpreter each: whichever comes first, neither registers in the other's pool.
    done = subprocess.run(
        [sys.executable, "-c", BOTH.format(first=first, second=second)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-3000:]
