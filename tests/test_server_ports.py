"""Ports for the servers tests and benchmarks start: never one port for two servers, and the S3
server's start when a port chosen free was taken before it bound it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from bench import peers, seaweedfs
from bench.seaweedfs import SeaweedS3


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the S3 server is unavailable: {why}")
    pytest.skip(f"the S3 server is unavailable: {why}")


class _Kernel:
    """Ephemeral binds as Linux hands them out under churn: the lowest free port of a small range,
    so a port closed a moment ago is the next one given."""

    def __init__(self) -> None:
        self.bound: set[int] = set()

    def socket(self) -> _Socket:
        return _Socket(self)


class _Socket:
    def __init__(self, kernel: _Kernel) -> None:
        self.kernel, self.port = kernel, 0

    def bind(self, address: tuple[str, int]) -> None:
        port = address[1] or min(p for p in range(40000, 40100) if p not in self.kernel.bound)
        if port in self.kernel.bound:
            raise OSError(98, "Address already in use")
        self.kernel.bound.add(port)
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        self.kernel.bound.discard(self.port)

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> _Kernel:
    """Every socket of the test made by a :class:`_Kernel`."""
    fake = _Kernel()
    monkeypatch.setattr(socket, "socket", fake.socket)
    return fake


def test_the_four_servers_get_distinct_ports_and_grpc_twins_even_when_freed_ports_are_handed_out_again(
    kernel: _Kernel,
) -> None:
    ports = seaweedfs.free_port_pairs(book=peers.PortBook())
    assert set(ports) == {"master", "volume", "filer", "s3"}
    every = list(ports.values()) + [p + 10000 for p in ports.values()]
    assert len(set(every)) == 8, ports
    assert not kernel.bound  # every probe socket was closed


def test_free_port_never_hands_out_a_port_twice_even_when_the_kernel_does(kernel: _Kernel) -> None:
    book = peers.PortBook()
    ports = [book.free_port() for _ in range(5)]
    assert len(set(ports)) == 5, ports
    assert book.free_port(preferred=ports[0]) not in ports  # given already: not again
    assert book.free_port(preferred=40077) == 40077
    assert not kernel.bound


def test_a_server_whose_chosen_port_was_taken_meanwhile_starts_on_other_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = seaweedfs.cached_binary()
    if binary is None:
        unavailable("weed is not built (bin/seaweedfs-build.sh)")
    taker = socket.socket()
    taker.bind(("127.0.0.1", 0))
    taker.listen()
    real = seaweedfs.free_port_pairs
    given: list[dict[str, int]] = []

    def first_with_a_taken_port(names: Any = seaweedfs.SERVERS) -> dict[str, int]:
        ports = real(names)
        if not given:
            ports["filer"] = int(taker.getsockname()[1])
        given.append(dict(ports))
        return ports

    monkeypatch.setattr(seaweedfs, "free_port_pairs", first_with_a_taken_port)
    server = SeaweedS3(tmp_path / "s3", binary=binary)
    try:
        server.start()
        assert len(given) == 2
        assert server.ports == given[1]
        client = server.client()
        client.create_bucket(Bucket="after-a-taken-port")
        client.put_object(Bucket="after-a-taken-port", Key="k", Body=b"v")
        assert client.get_object(Bucket="after-a-taken-port", Key="k")["Body"].read() == b"v"
    finally:
        server.kill()  # nothing to keep; a graceful stop of weed takes 15 s
        taker.close()
