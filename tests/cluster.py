"""A Spark standalone cluster on 127.0.0.1 for tests: one master and some workers, started with
pyspark's own ``spark-class``, stopped after.

The tests' own SparkSession stays ``local[2]`` (one session per process); work meant for the
cluster runs in a subprocess (``spark-submit --master <url>``, or a Python process whose session
names the master), as users run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers import free_port


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


class ClusterUnavailable(RuntimeError):
    """The cluster did not come up (its processes' log tails say why)."""


class ForeignServer(OSError):
    """Another server answers on the port chosen for the master's UI (it was taken between the
    choice and the master's start)."""


@dataclass
class SparkCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores and ``memory`` each.

    Attributes:
        workdir: logs and the workers' work directories (executors' stderr lands there).
        url: ``spark://127.0.0.1:<port>`` once started (7077 when it is free).
    """

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    url: str = ""
    ui: str = ""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """The environment the cluster's JVMs (and so its executors and Python workers) run with."""
        env = dict(os.environ)
        env.update(
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_HOME=str(spark_home()),
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=str(self.workdir / "logs"),
        )
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("PYSPARK_GATEWAY_SECRET", None)
        return env

    def _launch(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 -- the process owns it
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        self._procs.append(
            subprocess.Popen(
                command, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def start(self, timeout_s: float = 120, attempts: int = 3) -> SparkCluster:
        """Start the master, then the workers; return once every worker is ALIVE at the master.
        Started again on other ports when another server answers on the master's UI port.

        Raises:
            ClusterUnavailable: not up within ``timeout_s``.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            return self._start(time.monotonic() + timeout_s, attempts)
        except BaseException:
            self.stop()  # an error of its own leaves no JVM behind (one left a master and two workers)
            raise

    def _start(self, deadline: float, attempts: int) -> SparkCluster:
        for _ in range(attempts):
            self._launch_all()
            foreign = False
            while time.monotonic() < deadline:
                try:
                    if len(self._alive(self.state())) >= self.workers:
                        return self
                except ForeignServer:
                    foreign = True
                    break
                except OSError:
                    pass  # not listening yet
                if any(p.poll() is not None for p in self._procs):
                    break
                time.sleep(1)
            if not foreign:
                break
            self.stop()
        tails = {p.name: p.read_text(errors="replace")[-500:] for p in self.workdir.glob("*.log")}
        raise ClusterUnavailable(f"the Spark cluster did not come up: {tails}")

    def _launch_all(self) -> None:
        port, ui = free_port(7077), free_port()
        self.url, self.ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
        self._launch(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
        )  # fmt: skip
        for i in range(self.workers):
            work = self.workdir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._launch(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(free_port()), "--work-dir", str(work),
            )  # fmt: skip

    def state(self) -> dict[str, object]:
        """The master's JSON state (workers, applications).

        Raises:
            OSError: the master does not answer.
            ForeignServer: another server answers on its UI port.
        """
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as answer:
            text = answer.read()
        try:
            state = json.loads(text)
        except ValueError:
            raise ForeignServer(f"{self.ui} answers, but not as the master: {text[:80]!r}") from None
        if not isinstance(state, dict) or state.get("url") != self.url:
            raise ForeignServer(f"{self.ui} is the UI of another master ({str(state)[:80]})")
        return state

    @staticmethod
    def _alive(state: dict[str, object]) -> list[dict[str, object]]:
        workers = state.get("workers", [])
        return [w for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE"]  # type: ignore[union-attr]

    def alive_workers(self) -> list[dict[str, object]]:
        try:
            return self._alive(self.state())
        except OSError:
            return []

    def executor_pids(self) -> list[int]:
        """Process ids of the executor JVMs running now (launched by this cluster's workers)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            # an executor runs in <worker work dir>/<app id>/<executor id>
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(
                str(self.workdir)
            ):
                found.append(int(proc.name))
        return found

    def executor_logs(self) -> list[Path]:
        """The stderr file of every executor the workers ever launched (``<work>/<app>/<id>/stderr``)."""
        return sorted(self.workdir.glob("worker-*/app-*/*/stderr"))

    def stop(self) -> None:
        """Stop the workers and the master (SIGTERM, then SIGKILL) and the executors they left."""
        for pid in self.executor_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        self._procs.clear()
