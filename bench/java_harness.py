"""The Maven-built RocketMQ client harness (``tests/java/harness``): build it once, run its scenarios.

The harness is unmodified Apache RocketMQ client code (``rocketmq-client`` from Maven Central) in a
small Java program; the tests and the wire benchmark run it against lakemq's ``mq serve`` and the real
RocketMQ broker. Building needs Maven online once (``dependency:go-offline``), then works offline. The
built jar and its class path are cached under ``~/.m2/lakemq-harness/<hash of the Java sources>``,
so a rerun with unchanged sources starts the JVM at once, and a source change rebuilds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JAVA_DIR = ROOT / "tests" / "java"
HARNESS_DIR = JAVA_DIR / "harness"
MQADMIN_DIR = JAVA_DIR / "mqadmin"  # rocketmq-tools only: the unmodified mqadmin
QMQ_DIR = JAVA_DIR / "qmq"  # the QMQ client harness: unmodified com.qunar.qmq:qmq code
QMQ_MAIN_CLASS = "lakemq.qmq.Main"
ROCKETMQ5_DIR = JAVA_DIR / "rocketmq5"  # the RocketMQ 5 client harness: unmodified rocketmq-client-java
ROCKETMQ5_MAIN_CLASS = "lakemq.rmq5.Main"
MAIN_CLASS = "lakemq.harness.Main"
MQADMIN_CLASS = "org.apache.rocketmq.tools.command.MQAdminStartup"
CACHE_ROOT = Path(os.environ.get("LAKEMQ_HARNESS_CACHE", str(Path.home() / ".m2" / "lakemq-harness")))
MAVEN_TIMEOUT_S = 1200


class HarnessError(RuntimeError):
    """Maven or Java is missing, a build failed, or a scenario could not be run."""


def maven() -> str:
    """The ``mvn`` executable; raises HarnessError when Maven is not installed."""
    found = shutil.which("mvn")
    if found is None:
        raise HarnessError("Maven (mvn) is not installed: .ci/run installs it with apt-get")
    return found


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise HarnessError("java is not installed")
    return found


def sources_hash(project: Path) -> str:
    """A digest of a Maven project's pom and sources: the cache key of what it builds."""
    digest = hashlib.sha256()
    files = [project / "pom.xml", *sorted((project / "src").rglob("*") if (project / "src").exists() else [])]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(project)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run_maven(project: Path, *goals: str, offline: bool = False) -> str:
    """Run Maven in ``project`` in batch mode; its output. Raises HarnessError on failure."""
    cmd = [maven(), "-B", "-q", *(["-o"] if offline else []), *goals]
    done = subprocess.run(
        cmd, cwd=project, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise HarnessError(f"{' '.join(cmd)} failed in {project} (exit {done.returncode}):\n{tail}")
    return done.stdout


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two processes building the same thing wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_dependencies(project: Path) -> None:
    """``mvn dependency:go-offline dependency:resolve`` (online; a no-op when everything is in ~/.m2
    already). go-offline alone leaves some of rocketmq-tools' transitive jars (slf4j-api 1.7.32) out."""
    run_maven(project, "dependency:go-offline", "dependency:resolve")


def classpath_of(project: Path, name: str) -> str:
    """The dependency class path of a Maven project, resolved once per pom and cached."""
    key = sources_hash(project) if (project / "src").exists() else _pom_hash(project)
    target = CACHE_ROOT / f"{name}-{key}"
    cached = target / "classpath.txt"
    with _locked(CACHE_ROOT / f"{name}.lock"):
        if not cached.exists():
            fetch_dependencies(project)
            target.mkdir(parents=True, exist_ok=True)
            out = target / "classpath.tmp"
            run_maven(project, "dependency:build-classpath", f"-Dmdep.outputFile={out}", offline=True)
            out.replace(cached)
    return cached.read_text().strip()


def _pom_hash(project: Path) -> str:
    return hashlib.sha256((project / "pom.xml").read_bytes()).hexdigest()[:16]


def built_classpath(project: Path, name: str, artifact: str) -> str:
    """A Maven project's full class path: its jar (``target/<artifact>``, built and cached by the hash
    of its sources), then its dependencies' jars."""
    key = sources_hash(project)
    target = CACHE_ROOT / f"{name}-{key}"
    jar = target / f"{name}.jar"
    deps = classpath_of(project, name)
    with _locked(CACHE_ROOT / f"{name}-build.lock"):
        if not jar.exists():
            run_maven(project, "package", offline=True)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(project / "target" / artifact, target / f"{name}.tmp")
            (target / f"{name}.tmp").replace(jar)
    return f"{jar}{os.pathsep}{deps}"


def harness_classpath() -> str:
    """The harness's full class path (its jar, then the RocketMQ client's jars), building when needed."""
    return built_classpath(HARNESS_DIR, "harness", "rocketmq-harness-1.0.jar")


def qmq_classpath() -> str:
    """The QMQ harness's full class path (its jar, then the QMQ client's jars), building when needed."""
    return built_classpath(QMQ_DIR, "qmq", "qmq-harness-1.0.jar")


def rocketmq5_classpath() -> str:
    """The RocketMQ 5 harness's full class path (its jar, then rocketmq-client-java), building when needed."""
    return built_classpath(ROCKETMQ5_DIR, "rocketmq5", "rocketmq5-harness-1.0.jar")


def rocketmq5_command(classpath: str, log_dir: Path, *args: str, heap_mb: int = 256) -> list[str]:
    """The ``java`` command line of a RocketMQ 5 harness scenario (its ``~``, where the client logs,
    in ``log_dir``)."""
    return [
        java(),
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        f"-Duser.home={log_dir}",
        "-Drocketmq.log.level=INFO",
        "-cp",
        classpath,
        ROCKETMQ5_MAIN_CLASS,
        *args,
    ]


def start_rocketmq5_scenario(classpath: str, log_dir: Path, scenario: str, **opts: object) -> Scenario:
    """Start a RocketMQ 5 harness scenario in the background (``produce``, ``transaction``, ``simple``,
    ``push``: ``tests/java/rocketmq5``'s Main says what each does)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return Scenario(rocketmq5_command(classpath, log_dir, scenario, *options(opts)))


def qmq_command(classpath: str, log_dir: Path, *args: str, heap_mb: int = 256) -> list[str]:
    """The ``java`` command line of a QMQ harness scenario (its ``~`` in ``log_dir``)."""
    return [
        java(),
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        f"-Duser.home={log_dir}",
        "-cp",
        classpath,
        QMQ_MAIN_CLASS,
        *args,
    ]


def start_qmq_scenario(classpath: str, log_dir: Path, scenario: str, **opts: object) -> Scenario:
    """Start a QMQ harness scenario in the background (``produce``, ``consume``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return Scenario(qmq_command(classpath, log_dir, scenario, *options(opts)))


def mqadmin_classpath() -> str:
    """The class path of unmodified ``mqadmin`` (rocketmq-tools and its dependencies), resolved once."""
    return classpath_of(MQADMIN_DIR, "mqadmin")


def mqadmin_command(classpath: str, home: Path, *args: str) -> list[str]:
    """The ``java`` command line of one ``mqadmin`` command (``-n host:port`` among ``args``); its
    logs and ``~`` in ``home``."""
    return [
        java(),
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Duser.home={home}",
        f"-Drocketmq.home.dir={MQADMIN_DIR}",  # its conf/logback_tools.xml
        f"-Drocketmq.client.logRoot={home / 'logs'}",
        "-Drocketmq.client.logLevel=WARN",
        "-cp",
        classpath,
        MQADMIN_CLASS,
        *args,
    ]


@dataclass(frozen=True)
class ScenarioRun:
    """What one scenario printed: its JSON events (in order), its exit code and its standard error."""

    events: tuple[dict[str, Any], ...]
    returncode: int
    stderr: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind (``sent``, ``received``, ``checked``, ``done`` …)."""
        return [e for e in self.events if e.get("event") == kind]

    def done(self) -> dict[str, Any]:
        """The closing ``done`` event; raises HarnessError when the scenario did not reach its end."""
        found = self.of("done")
        if self.returncode != 0 or not found:
            raise HarnessError(f"scenario ended with exit code {self.returncode}:\n{self.stderr[-3000:]}")
        return found[-1]


def java_command(
    classpath: str,
    log_dir: Path,
    *args: str,
    heap_mb: int = 256,
    properties: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``java`` command line of a harness scenario (client logs and local offsets in ``log_dir``);
    ``properties``: system properties set after the defaults, so they override them
    (``{"rocketmq.client.logLevel": "INFO"}``)."""
    defaults = {
        "rocketmq.client.logRoot": str(log_dir),
        "rocketmq.client.logLevel": "WARN",
        "rocketmq.client.localOffsetStoreDir": str(log_dir / "offsets"),
        "user.home": str(log_dir),
    }
    return [
        java(),
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        *(f"-D{name}={value}" for name, value in {**defaults, **(properties or {})}.items()),
        "-cp",
        classpath,
        MAIN_CLASS,
        *args,
    ]


def options(values: Mapping[str, object]) -> list[str]:
    """``{"namesrv": "h:p", "count": 3}`` -> ``["--namesrv", "h:p", "--count", "3"]``."""
    out: list[str] = []
    for name, value in values.items():
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


class Scenario:
    """A scenario running in the background: its events are collected as they are printed."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.events: list[dict[str, Any]] = []
        self._seen = threading.Condition()
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._seen:
                    self.events.append(json.loads(line))
                    self._seen.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def count(self, kind: str) -> int:
        """How many events of ``kind`` the scenario has printed so far."""
        with self._seen:
            return sum(1 for e in self.events if e.get("event") == kind)

    def wait_for(self, kind: str, timeout_s: float = 120) -> dict[str, Any]:
        """The first event of ``kind``, waiting for it; raises HarnessError if the scenario ends first."""
        deadline = time.monotonic() + timeout_s
        with self._seen:
            while True:
                found = [e for e in self.events if e.get("event") == kind]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    raise HarnessError(
                        f"no {kind!r} event (exit code {self.proc.poll()}):\n{''.join(self._stderr)[-3000:]}"
                    )
                self._seen.wait(min(left, 0.2))

    def finish(self, timeout_s: float = 300) -> ScenarioRun:
        """Wait for the scenario's end (killing it after ``timeout_s``) and return what it printed."""
        note = ""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            note = f"\n(killed after {timeout_s} s)"
        for thread in self._threads:
            thread.join(timeout=10)
        return ScenarioRun(tuple(self.events), self.proc.returncode, "".join(self._stderr) + note)


def start_scenario(
    classpath: str,
    log_dir: Path,
    scenario: str,
    *,
    properties: Mapping[str, str] | None = None,
    **opts: object,
) -> Scenario:
    """Start a scenario in the background (see :meth:`Scenario.wait_for` and :meth:`Scenario.finish`);
    ``properties``: the JVM's system properties beyond the defaults (:func:`java_command`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return Scenario(java_command(classpath, log_dir, scenario, *options(opts), properties=properties))


def run_scenario(
    classpath: str, log_dir: Path, scenario: str, timeout_s: float = 300, **opts: object
) -> ScenarioRun:
    """Run a scenario to its end: ``run_scenario(cp, tmp, "produce", mode="sync", namesrv=...)``."""
    return start_scenario(classpath, log_dir, scenario, **opts).finish(timeout_s)


def main() -> int:
    """Fetch every Maven artifact the tests and the benchmark need and build the harness (``.ci/run``)."""
    from bench.rocketmq_peer import peer_classpath

    began = time.monotonic()
    harness = harness_classpath()
    tools = mqadmin_classpath()
    peer = peer_classpath()
    qmq = qmq_classpath()
    rocketmq5 = rocketmq5_classpath()
    print(f"harness: {harness.split(os.pathsep)[0]} (+{harness.count(os.pathsep)} jars)")
    print(f"mqadmin: {tools.count(os.pathsep) + 1} jars")
    print(f"QMQ harness: {qmq.split(os.pathsep)[0]} (+{qmq.count(os.pathsep)} jars)")
    print(f"RocketMQ 5 harness: {rocketmq5.split(os.pathsep)[0]} (+{rocketmq5.count(os.pathsep)} jars)")
    print(f"RocketMQ peer: {peer.count(os.pathsep) + 1} jars; ready in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
