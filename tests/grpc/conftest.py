"""The gRPC door's tests: a door over a fresh store with topic ``orders`` (2 queues), and a stub
of the door's own generated client on it."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from engine import Admin, Store
from engine.grpc import GrpcServer
from engine.grpc.v2 import service_pb2_grpc as spb_grpc


@pytest.fixture
def door(store: Store) -> Iterator[GrpcServer]:
    Admin(store).create_topic("orders", 2)
    with GrpcServer(store, port=0) as running:
        yield running


@pytest.fixture
def stub(door: GrpcServer) -> Iterator[spb_grpc.MessagingServiceStub]:
    with grpc.insecure_channel(door.address) as channel:
        yield spb_grpc.MessagingServiceStub(channel)
