"""The wheel works outside the repository: built, installed into a throwaway virtualenv in
tmp_path, and its ``mq`` run from a directory that is not the repository, finds the defaults
shipped in the package (quiet Spark included)."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_conf_ships_inside_the_package() -> None:
    from engine.config import PACKAGE_CONF_DIR, conf_dir

    assert PACKAGE_CONF_DIR.parent == Path(__import__("engine").__file__).resolve().parent
    assert {p.name for p in PACKAGE_CONF_DIR.iterdir()} >= {
        "engine.toml",
        "spark-defaults.conf",
        "log4j2.properties",
    }
    assert (REPO / "conf").resolve() == PACKAGE_CONF_DIR  # the repository's conf/ is the same files
    assert conf_dir() == PACKAGE_CONF_DIR or "MQ_CONF_DIR" in os.environ


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A virtualenv outside the repository with the wheel installed (dependencies borrowed from the
    test's environment through a .pth file: nothing is downloaded), and an environment for it."""
    base = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the tree: an in-tree build would reuse (and ship) stale files of build/.
    source = base / "source"
    skipped = (".git", ".venv", "build", "dist", "*.egg-info", "mqdata", "__pycache__", ".*_cache", "bench")
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*skipped))
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    built = _run([*wheel_cmd, "-w", str(base), str(source)], base, dict(os.environ))
    assert built.returncode == 0, built.stderr
    [wheel] = base.glob("lakemq-*.whl")
    with zipfile.ZipFile(wheel) as contents:
        names = set(contents.namelist())
    assert {
        "engine/conf/engine.toml",
        "engine/conf/log4j2.properties",
        "engine/dashboard/templates/base.html",
    } <= names
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, dict(os.environ))
    assert made.returncode == 0, made.stderr
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Dependencies from this environment's site-packages, after the venv's own: a .pth line adds a
    # directory without running that directory's .pth files, so the repository's editable install
    # is not picked up.
    (purelib / "borrowed-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQ_", "SPARK_CONF", "PYTHONPATH"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(python)
    install = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        base,
        env,
    )
    assert install.returncode == 0, install.stderr
    return venv, env


@pytest.mark.slow
def test_the_installed_mq_works_from_any_directory(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    venv, env = installed
    mq = str(venv / "bin" / "mq")
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import engine, engine.config as c; print(engine.__file__, c.conf_dir())",
        ],
        tmp_path,
        env,
    )
    module, conf = where.stdout.split()
    assert module.startswith(str(venv)) and conf.startswith(str(venv)), where.stdout
    assert Path(conf, "log4j2.properties").is_file()

    assert _run([mq, "topic", "create", "Orders", "--queues", "2"], tmp_path, env).returncode == 0
    sent = _run([mq, "send", "Orders", "hello", "--keys", "order-1", "--json"], tmp_path, env)
    assert sent.returncode == 0, sent.stderr
    msg_id = json.loads(sent.stdout)["msg_id"]
    assert _run([mq, "dispatch", "--once", "--no-spark"], tmp_path, env).returncode == 0
    viewed = _run([mq, "message", "view", msg_id, "--json"], tmp_path, env)
    assert json.loads(viewed.stdout)["body"] == "hello"
    assert (tmp_path / "mqdata" / "commit_log" / "_delta_log").is_dir()  # ./mqdata of the cwd

    bad = _run([mq, "topic", "stats", "Nope"], tmp_path, env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

    query = _run([mq, "sql", "SELECT count(*) AS n FROM messages", "--json"], tmp_path, env, timeout=240)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["rows"] == [{"n": 1}]
    # Quiet Spark: the packaged log4j2.properties was found, so no WARN lines and no stage bars.
    noise = [line for line in query.stderr.splitlines() if " WARN " in line or "[Stage " in line]
    assert noise == [], query.stderr
