"""The gRPC door's committed stubs (engine/grpc/v2) are what bin/gen-grpc-stubs.sh makes from the
committed protos (engine/grpc/protos), byte for byte: a proto changed without regenerating, or a
generated file edited by hand, fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
