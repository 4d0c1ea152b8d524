"""Fixtures of the endpoint tests: a server on ephemeral ports over a fresh store, and wire clients to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import Admin, Store
from engine.remoting import RemotingServer
from tests.remoting.wire_client import WireClient


@pytest.fixture
def server(store: Store) -> Iterator[RemotingServer]:
    """An endpoint on ephemeral ports; no background jobs, so each test dispatches when it means to."""
    Admin(store).create_topic("T", 4)
    with RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as srv:
        yield srv


@pytest.fixture
def broker(server: RemotingServer) -> Iterator[WireClient]:
    client = WireClient(server.broker_address)
    yield client
    client.close()


@pytest.fixture
def namesrv(server: RemotingServer) -> Iterator[WireClient]:
    client = WireClient(server.namesrv_address)
    yield client
    client.close()
