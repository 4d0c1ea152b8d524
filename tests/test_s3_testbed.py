"""The object-storage test bed itself: the SeaweedFS server the run starts and the fault proxy."""

from __future__ import annotations

from typing import Any

import pytest

from bench.s3proxy import S3Proxy

pytestmark = pytest.mark.s3


def test_server_refuses_a_second_conditional_put_of_one_key(s3_server: Any) -> None:
    s3_server.probe_conditional_put()  # raises SeaweedUnavailable otherwise


def test_reader_identity_may_read_but_not_write(s3_server: Any, s3_bucket: str) -> None:
    from botocore.exceptions import ClientError

    s3_server.client().put_object(Bucket=s3_bucket, Key="ro/x", Body=b"1")
    reader = s3_server.client(s3_server.reader)
    assert reader.get_object(Bucket=s3_bucket, Key="ro/x")["Body"].read() == b"1"
    with pytest.raises(ClientError, match="AccessDenied"):
        reader.put_object(Bucket=s3_bucket, Key="ro/y", Body=b"2")


def test_proxy_forwards_and_counts_requests(s3_server: Any, s3_bucket: str) -> None:
    with S3Proxy(s3_server.endpoint) as proxy:
        client = s3_server.client(endpoint=proxy.endpoint)
        client.put_object(Bucket=s3_bucket, Key="p/a", Body=b"x" * 70_000)
        assert client.get_object(Bucket=s3_bucket, Key="p/a")["Body"].read() == b"x" * 70_000
        assert proxy.requests == 2


def test_proxy_times_each_request_with_its_delay_and_the_servers_own_time(
    s3_server: Any, s3_bucket: str
) -> None:
    with S3Proxy(s3_server.endpoint, delay_ms=30) as proxy:
        client = s3_server.client(endpoint=proxy.endpoint)
        client.put_object(Bucket=s3_bucket, Key="p/t", Body=b"x")
        assert proxy.requests == 1  # control requests are neither counted nor timed
        client.get_object(Bucket=s3_bucket, Key="p/t")
        first = proxy.round_trips()
        assert len(first) == 2 and all(ms >= 30 for ms in first), first
        assert proxy.round_trips() == []  # each reading takes what came since the last one
        proxy.delay_ms = 0
        client.head_object(Bucket=s3_bucket, Key="p/t")
        (head,) = proxy.round_trips()
        assert 0 < head < 30


def test_proxy_fails_before_forwarding_then_lets_requests_through(s3_server: Any, s3_bucket: str) -> None:
    from botocore.exceptions import ClientError

    with S3Proxy(s3_server.endpoint) as proxy:
        client = s3_server.client(endpoint=proxy.endpoint)
        rule = proxy.fail(r"/p/b$", method="PUT", status=503)
        with pytest.raises(ClientError):
            client.put_object(Bucket=s3_bucket, Key="p/b", Body=b"1")
        assert rule.hits == [f"PUT /{s3_bucket}/p/b"]
        with pytest.raises(ClientError, match="NoSuchKey"):  # it never reached the server
            s3_server.client().get_object(Bucket=s3_bucket, Key="p/b")
        client.put_object(Bucket=s3_bucket, Key="p/b", Body=b"2")  # the rule was used up
        assert s3_server.client().get_object(Bucket=s3_bucket, Key="p/b")["Body"].read() == b"2"


def test_proxy_fails_after_forwarding_a_write_that_lands(s3_server: Any, s3_bucket: str) -> None:
    from botocore.exceptions import ClientError

    with S3Proxy(s3_server.endpoint) as proxy:
        client = s3_server.client(endpoint=proxy.endpoint)
        proxy.fail(r"/p/c$", method="PUT", status=503, after=True)
        with pytest.raises(ClientError):
            client.put_object(Bucket=s3_bucket, Key="p/c", Body=b"landed")
        assert s3_server.client().get_object(Bucket=s3_bucket, Key="p/c")["Body"].read() == b"landed"


def test_proxy_holds_slow_requests_and_matches_by_method(s3_server: Any, s3_bucket: str) -> None:
    with S3Proxy(s3_server.endpoint) as proxy:
        client = s3_server.client(endpoint=proxy.endpoint)
        slow = proxy.slow(r"/p/d$", hold_ms=1, method="GET")
        client.put_object(Bucket=s3_bucket, Key="p/d", Body=b"1")
        assert slow.hits == []
        client.get_object(Bucket=s3_bucket, Key="p/d")
        assert slow.hits == [f"GET /{s3_bucket}/p/d"]
        proxy.clear()
        assert slow.times == 0  # cleared rules match nothing more
        assert proxy.record() == []
        client.get_object(Bucket=s3_bucket, Key="p/d")
        assert proxy.record(False) == [f"GET /{s3_bucket}/p/d"]
        assert slow.hits == [f"GET /{s3_bucket}/p/d"]


def test_proxy_refuses_an_upstream_that_is_not_http_host_port() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        S3Proxy("https://example.invalid")
