"""The engine's layers, checked on the source: which package may not import which.

Bottom up: ``engine.protocol`` (pure rules: no I/O, no table; it imports nothing of the engine but
the error hierarchy), ``engine.store`` (with its Delta kernel ``engine.store.delta``, the only code
that talks to delta-rs, and the commit-log sequencer ``engine.store.commit_log``), ``engine.client``
and ``engine.broker`` (siblings that never import each other), ``engine.spark``, then ``engine.cli``
and the ``jobs/`` entry points; the doors (``engine.remoting``, ``engine.qmq``, ``engine.grpc``) above
client and broker.

Each rule is (package, forbidden): no module of ``package`` (the package itself or anything under it)
may import ``forbidden`` or anything under it, at module level or inside a function, with an
``import`` statement or ``importlib.import_module("...")``. Add a row to :data:`RULES` for a new rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_NOT_STORE = (
    "engine.protocol",
    "engine.client",
    "engine.broker",
    "engine.spark",
    "engine.cli",
    "engine.dashboard",
    "engine.remoting",
    "engine.qmq",
    "engine.grpc",
)
# Everything of the engine but the protocol and its errors.
_ENGINE = (
    "engine.model",
    "engine.config",
    "engine.closing",
    "engine.collector",
    "engine.store",
    *_NOT_STORE[1:],
)
# The store's rooms other than its Delta kernel (every module and sub-package of engine/store): they
# import the kernel's face, never its modules.
_STORE_ROOMS = tuple(
    f"engine.store.{p.stem}"
    for p in sorted((ROOT / "engine/store").iterdir())
    if p.name not in ("__init__.py", "delta", "__pycache__") and (p.suffix == ".py" or p.is_dir())
)
_KERNEL_MODULES = tuple(
    f"engine.store.delta.{p.stem}"
    for p in sorted((ROOT / "engine/store/delta").glob("*.py"))
    if p.stem != "__init__"
)
RULES: tuple[tuple[str, str], ...] = (
    ("engine", "jobs"),  # jobs/ are entry points on top of the engine, never under it
    # Only the Delta kernel talks to delta-rs (ruff's TID251 says so too, for the whole tree).
    *((package, "deltalake") for package in (*_NOT_STORE, *_STORE_ROOMS)),
    # Pure rules are at the bottom: nothing of the engine but its errors.
    *(("engine.protocol", other) for other in _ENGINE),
    # The store knows no caller.
    *(("engine.store", upper) for upper in _NOT_STORE[1:]),
    # The Delta kernel is one seam: the rest of the engine goes through engine.store.delta's face.
    *(
        (package, kernel_module)
        for package in (*_NOT_STORE, *_STORE_ROOMS, "engine.model", "engine.config", "engine.closing")
        for kernel_module in _KERNEL_MODULES
    ),
    # The kernel knows nothing of the tables above it (only the marker registry it writes).
    *(("engine.store.delta", room) for room in _STORE_ROOMS if room not in ("engine.store.commit_markers",)),
    # Client and broker are siblings: what both need lives below them.
    ("engine.client", "engine.broker"),
    ("engine.broker", "engine.client"),
    *(
        (lower, upper)
        for lower in ("engine.client", "engine.broker")
        for upper in ("engine.spark", "engine.cli")
    ),
    ("engine.spark", "engine.cli"),
    # The dashboard is a front end beside the CLI: nothing below it imports it, it imports no CLI.
    *(
        (lower, "engine.dashboard")
        for lower in ("engine.protocol", "engine.store", "engine.client", "engine.broker", "engine.spark")
    ),
    ("engine.dashboard", "engine.cli"),
    # The wire endpoints (doors: RocketMQ's, QMQ's) are a layer above client and broker, beside
    # spark: nothing below imports them, and the RocketMQ door does not import QMQ's.
    *(
        (lower, door)
        for door in ("engine.remoting", "engine.qmq", "engine.grpc")
        for lower in ("engine.protocol", "engine.store", "engine.client", "engine.broker", "engine.spark")
    ),
    ("engine.remoting", "engine.cli"),
    ("engine.qmq", "engine.cli"),
    ("engine.grpc", "engine.cli"),
    ("engine.remoting", "engine.qmq"),
    ("engine.remoting", "engine.grpc"),
    ("engine.qmq", "engine.grpc"),
)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _literal_prefix(node: ast.expr) -> str | None:
    """The text of a string literal, or the literal start of an f-string (``f"jobs.{x}"`` -> ``jobs.``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, relative ones resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:  # ``from engine import jobs`` imports engine.jobs
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            target = _literal_prefix(node.args[0]) if name in ("import_module", "__import__") else None
            if target:
                yield node.lineno, target.rstrip(".")


def violations(rules: tuple[tuple[str, str], ...] = RULES, root: Path = ROOT) -> list[str]:
    """``path:line: module imports name (rule package -/-> forbidden)`` for every broken rule."""
    found = []
    for path in sorted((root / "engine").rglob("*.py")):
        module = module_name(path, root)
        imported = list(imports_of(path.read_text(), module, path.name == "__init__.py"))
        for package, forbidden in rules:
            if not _within(module, package):
                continue
            for line, name in imported:
                if _within(name, forbidden):
                    where = path.relative_to(root)
                    found.append(f"{where}:{line}: {module} imports {name} ({package} -/-> {forbidden})")
    return found


def test_no_module_breaks_a_layer_rule() -> None:
    assert violations() == []


def test_the_checker_sees_every_kind_of_import() -> None:
    source = (
        "import jobs.dispatch\n"
        "from jobs import broker\n"
        "import importlib\n"
        "def f(name):\n"
        "    from deltalake import DeltaTable\n"
        "    return importlib.import_module(f'jobs.{name}')\n"
        "from .. import jobs\n"
    )
    found = list(imports_of(source, "engine.spark.x"))
    names = {name for _, name in found}
    assert {"jobs.dispatch", "jobs", "jobs.broker", "deltalake", "engine.jobs"} <= names
    assert (6, "jobs") in found
    assert not any(_within(n, "jobs") for n in ("jobsx", "engine.jobs_tools"))


@pytest.mark.parametrize(("package", "forbidden"), RULES)
def test_every_rule_names_packages_that_exist(package: str, forbidden: str) -> None:
    def exists(name: str) -> bool:
        path = ROOT / name.replace(".", "/")
        return path.is_dir() or path.with_suffix(".py").is_file()

    assert exists(package)
    assert forbidden == "deltalake" or exists(forbidden)


def test_a_broken_rule_is_reported_with_its_place(tmp_path: Path) -> None:
    (tmp_path / "engine" / "client").mkdir(parents=True)
    (tmp_path / "engine" / "client" / "bad.py").write_text("import os\n\nfrom engine.broker.retry import x\n")
    found = violations(RULES, tmp_path)
    assert found[0] == (
        "engine/client/bad.py:3: engine.client.bad imports engine.broker.retry"
        " (engine.client -/-> engine.broker)"
    )
    assert all(line.startswith("engine/client/bad.py:3:") for line in found)


@pytest.mark.parametrize(
    ("path", "source", "rule", "allowed"),
    [
        # The rest of the store goes through the kernel's face, never its modules.
        (
            "engine/store/index.py",
            "from engine.store.delta.commits import commit_next\n",
            "(engine.store.index -/-> engine.store.delta.commits)",
            "from engine.store.delta import commit_next\n",
        ),
        (
            "engine/store/index.py",
            "import deltalake\n",
            "(engine.store.index -/-> deltalake)",
            "from engine.store.delta import Snapshot\n",
        ),
        # The kernel knows no table module above it.
        (
            "engine/store/delta/log.py",
            "from engine.store.store import Store\n",
            "(engine.store.delta -/-> engine.store.store)",
            "import deltalake\nfrom engine.store.commit_markers import COUNTS_KEY\n",
        ),
        # Pure rules import nothing of the engine but its errors.
        (
            "engine/protocol/pull.py",
            "from engine.model import PullResult\n",
            "(engine.protocol -/-> engine.model)",
            "from engine.errors import InvalidArgumentError\n",
        ),
    ],
)
def test_the_kernel_seam_and_the_bottom_of_the_protocol_are_checked(
    tmp_path: Path, path: str, source: str, rule: str, allowed: str
) -> None:
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    target.write_text(source)
    assert any(line.endswith(rule) for line in violations(RULES, tmp_path))
    target.write_text(allowed)
    assert violations(RULES, tmp_path) == []
