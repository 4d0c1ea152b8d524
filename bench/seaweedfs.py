"""A real S3-compatible server on loopback for the object-storage tests and benchmarks: SeaweedFS.

``bin/seaweedfs-build.sh`` builds its ``weed`` binary from the Go module proxy once (about 8 minutes
on 2 cores) and caches it; ``.ci/run`` calls it before the tests. :class:`SeaweedS3` starts
``weed server`` with the filer and the S3 gateway on free 127.0.0.1 ports, a data directory of its
own, telemetry off and static keys (an admin identity and a read-only one), waits until it answers,
and probes that a second ``If-None-Match: *`` PUT of one key is refused with 412 before anything
trusts it: delta-rs 1.x keeps concurrent writers apart with exactly that conditional PUT, and a
server that ignores it silently forks a table.

    python -m bench.seaweedfs --build      # build (or find) weed and print its path
    python -m bench.seaweedfs              # start a server, print its options, wait for Ctrl-C
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.peers import PORTS, PortBook, stop_process_group

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "bin" / "seaweedfs-build.sh"
REGION = "us-east-1"
# gRPC ports of SeaweedFS's servers are their HTTP ports + 10000.
_GRPC_OFFSET = 10000


class SeaweedUnavailable(RuntimeError):
    """SeaweedFS could not be built, started, or does not honour conditional writes."""


class SeaweedExited(SeaweedUnavailable):
    """``weed server`` exited before it answered (a port it was given was taken meanwhile)."""


def build(timeout_s: float = 1800) -> Path:
    """The cached ``weed`` binary, building it first when missing (``bin/seaweedfs-build.sh``).

    Raises:
        SeaweedUnavailable: Go is missing or the build failed (its last lines say why).
    """
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SeaweedUnavailable(f"building SeaweedFS took over {timeout_s:.0f} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise SeaweedUnavailable(f"could not build SeaweedFS (exit {done.returncode}): {tail}")
    return Path(lines[-1])


def cached_binary() -> Path | None:
    """The ``weed`` binary if it was built already (no build), else None."""
    base = os.environ.get("MQ_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lakemq"
    )
    binary = Path(base) / "seaweedfs" / _script_version() / "weed"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def _script_version() -> str:
    override = os.environ.get("MQ_SEAWEEDFS_VERSION")
    if override:
        return override
    for line in BUILD_SCRIPT.read_text().splitlines():
        if line.startswith('VERSION="${MQ_SEAWEEDFS_VERSION:-'):
            return line.split(":-", 1)[1].split("}", 1)[0]
    raise SeaweedUnavailable(f"{BUILD_SCRIPT} names no VERSION")


SERVERS = ("master", "volume", "filer", "s3")


def free_port_pairs(names: tuple[str, ...] = SERVERS, book: PortBook = PORTS) -> dict[str, int]:
    """A loopback port ``p`` for each name such that ``p`` and ``p + 10000`` (its gRPC twin) are
    free; taken from ``book``, which never hands out a port twice (a server once got one port for
    its master and its filer, and exited), so no pair shares a port with another or with any other
    server of the process.
    """
    ports: dict[str, int] = {}
    for name in names:
        for _ in range(200):
            port = book.free_port()
            if port + _GRPC_OFFSET <= 65535 and book.free_port(port + _GRPC_OFFSET) == port + _GRPC_OFFSET:
                ports[name] = port
                break
        else:
            raise SeaweedUnavailable("no free pair of loopback ports for SeaweedFS")
    return ports


@dataclass(frozen=True)
class Identity:
    """One S3 identity: static keys, never the cloud's instance-metadata credentials."""

    access_key: str
    secret_key: str


@dataclass
class SeaweedS3:
    """``weed server`` with its S3 gateway on 127.0.0.1; a context manager.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>`` of the S3 gateway.
        admin: keys that may read and write every bucket.
        reader: keys that may only read and list (Spark's identity in the read-only tests).
    """

    workdir: Path
    binary: Path | None = None
    endpoint: str = ""
    admin: Identity = field(default_factory=lambda: Identity("lakemq-admin", secrets.token_hex(16)))
    reader: Identity = field(default_factory=lambda: Identity("lakemq-reader", secrets.token_hex(16)))
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout_s: float = 90) -> SeaweedS3:
        """Start the server (building ``weed`` first when needed) and probe it.

        Raises:
            SeaweedUnavailable: it cannot be built or started, or it ignores ``If-None-Match: *``.
        """
        if self.binary is None:
            self.binary = build()
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "s3.json"
        config.write_text(json.dumps(self._identities()))
        chosen = not self.ports
        for attempt in range(3):
            if chosen:
                self.ports = free_port_pairs()
            self._launch(data, config)
            self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
            try:
                self._wait_ready(timeout_s)
                break
            except SeaweedExited:
                # a port chosen free was taken before weed bound it: choose again
                if not chosen or attempt == 2:
                    raise
        self.probe_conditional_put()
        return self

    def _identities(self) -> dict[str, Any]:
        return {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.admin.access_key, "secretKey": self.admin.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                },
                {
                    "name": "reader",
                    "credentials": [
                        {"accessKey": self.reader.access_key, "secretKey": self.reader.secret_key}
                    ],
                    "actions": ["Read", "List"],
                },
            ]
        }

    def _launch(self, data: Path, config: Path) -> None:
        assert self.binary is not None
        p = self.ports
        args = [
            str(self.binary),
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={p['master']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            "-volume.max=0",
            # a test server has no peers to hand over to: stop at once (10 s by default)
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p['filer']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.config={config}",
            # fixed default ports a second server (or anything else) may hold: not needed here
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        log = (self.workdir / "weed.log").open("ab")
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        bucket = f"ready-{uuid.uuid4().hex[:8]}"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SeaweedExited(f"weed server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                client = self.client()
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="ready", Body=b"1")
                client.delete_object(Bucket=bucket, Key="ready")
                client.delete_bucket(Bucket=bucket)
                return
            except Exception as exc:  # not up yet: connection refused, 503 while volumes grow
                last = exc
                time.sleep(0.5)
        self.stop()
        raise SeaweedUnavailable(f"SeaweedFS did not answer within {timeout_s:.0f} s: {last}")

    def stop(self, grace_s: float = 15) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``grace_s``)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process_group(proc, grace_s)

    def kill(self) -> None:
        """SIGKILL the server at once (a crash mid-commit); :meth:`restart` brings it back."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def restart(self, timeout_s: float = 90) -> None:
        """Start the server again on the same ports and data directory."""
        self.stop()
        self._launch(self.workdir / "data", self.workdir / "s3.json")
        self._wait_ready(timeout_s)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 5) -> str:
        path = self.workdir / "weed.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    # ------------------------------------------------------------------ clients and options
    def storage_options(
        self, identity: Identity | None = None, endpoint: str | None = None
    ) -> dict[str, str]:
        """delta-rs storage options for this server (static keys, plain HTTP, path style)."""
        who = identity or self.admin
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": who.access_key,
            "AWS_SECRET_ACCESS_KEY": who.secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self, identity: Identity | None = None, endpoint: str | None = None) -> Any:
        """A boto3 S3 client for setting up and inspecting buckets (the engine itself uses delta-rs)."""
        import boto3
        from botocore.config import Config

        who = identity or self.admin
        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=who.access_key,
            aws_secret_access_key=who.secret_key,
            region_name=REGION,
            config=Config(
                s3={"addressing_style": "path"}, retries={"total_max_attempts": 1, "mode": "standard"}
            ),
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default) and return its name."""
        bucket = name or f"mq-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def probe_conditional_put(self) -> None:
        """Refuse a server that lets a second ``If-None-Match: *`` PUT of one key through.

        Raises:
            SeaweedUnavailable: the second PUT succeeded (the server would fork Delta tables).
        """
        from botocore.exceptions import ClientError

        client = self.client()
        bucket = self.create_bucket(f"probe-{uuid.uuid4().hex[:8]}")
        try:
            client.put_object(Bucket=bucket, Key="v/00.json", Body=b"first", IfNoneMatch="*")
            try:
                client.put_object(Bucket=bucket, Key="v/00.json", Body=b"second", IfNoneMatch="*")
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status in (409, 412):
                    return
                raise SeaweedUnavailable(f"conditional PUT probe answered {status}: {exc}") from exc
            raise SeaweedUnavailable(
                "SeaweedFS accepted a second If-None-Match: * PUT of one key: concurrent Delta writers "
                "would overwrite each other's commits"
            )
        finally:
            for key in ("v/00.json",):
                client.delete_object(Bucket=bucket, Key=key)
            client.delete_bucket(Bucket=bucket)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seaweedfs", description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="build (or find) weed, print its path, exit")
    args = parser.parse_args(argv)
    try:
        if args.build:
            print(build())
            return 0
        with tempfile.TemporaryDirectory(prefix="mq-seaweed-") as tmp, SeaweedS3(Path(tmp)) as server:
            bucket = server.create_bucket("lakemq")
            print(f"SeaweedFS S3 on {server.endpoint}, bucket {bucket}; storage options:")
            for key, value in server.storage_options().items():
                print(f"  --storage-option {key}={value}")
            print("Ctrl-C stops it", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
    except SeaweedUnavailable as exc:
        print(f"seaweedfs: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
