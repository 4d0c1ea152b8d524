"""Repairing a Delta log damaged by a crash: a torn last commit file, stray checksum files.

delta-rs commits by writing ``_delta_log/NNN.json#k`` and hard-linking it to ``NNN.json``, so a killed
process never leaves a commit file half-written. A torn commit file comes from below the process: an
OS crash or power loss before the page cache reached the disk (object_store's local filesystem does
not fsync, so the file can come back cut short or zero-filled), a filesystem without atomic link, or
a tool copying a log. delta-rs then refuses to load the whole table ("Json error: Truncated record").

The only damage repaired here is a *last* commit file that does not parse, or parses but holds fewer
actions than its commitInfo records (cut exactly at a line break). No reader can have read
that commit, and no writer can have committed after it; its content is lost whatever is done (if its
writer was told it succeeded before the data was durable, that acknowledgement was a page-cache one).
Moving the file aside gives the table back its previous version, and the next writer that version
number. The file is kept in ``_delta_log/_quarantine/`` (delta-rs ignores subdirectories of the log)
for inspection, with a logged warning. Anything else (an earlier commit that does not parse) means
later commits were built on data that is now unreadable: that is
:class:`~engine.errors.StoreCorruptedError`, naming the file, and nothing is moved.

An empty last commit file is left alone: delta-rs reads it as a commit without actions, which is
harmless, and live writers may already have committed on top of it.

The newest checkpoint, torn the same way, is moved aside too (with the ``_last_checkpoint`` hint that
points at it) when the commit files it summarizes are all still there: it only repeats them, and
delta-rs then starts from the previous checkpoint. When they are gone (the log was cleaned up after
it), that is a :class:`~engine.errors.StoreCorruptedError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import StoreCorruptedError
from engine.store.delta.log import COMMIT_FILE, missing_actions
from engine.store.delta.objects import local_path

QUARANTINE_DIR = "_quarantine"
_CHECKSUM = re.compile(r"^(\d{20})\.crc$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")
_LAST_CHECKPOINT = "_last_checkpoint"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Repair:
    """What :func:`repair_log` moved aside: ``(original, quarantined)`` paths."""

    moved: tuple[tuple[str, str], ...]


def commit_parses(data: bytes) -> bool:
    """True when every non-empty line of a commit file is a JSON object (an empty file counts) and
    the file holds as many actions as its commitInfo records (a file cut exactly at a line break
    parses, but comes up short: see :func:`engine.store.delta.log.missing_actions`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    actions = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return False
        if not isinstance(action, dict):
            return False
        actions.append(action)
    return not missing_actions(actions)


def parquet_readable(path: Path) -> bool:
    """True when a parquet file has both magic numbers and a footer that parses."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, os.SEEK_END)
            tail = f.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            return False
        pq.read_metadata(path)
    except (OSError, ValueError, pa.ArrowException):
        return False
    return True


def _versions(log: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    found = []
    for entry in log.iterdir():
        match = pattern.match(entry.name)
        if match is not None and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _quarantine(log: Path, path: Path, stamp: str) -> Path:
    target_dir = log / QUARANTINE_DIR
    target_dir.mkdir(exist_ok=True)
    target = target_dir / f"{path.name}.{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = target_dir / f"{path.name}.{stamp}.{n}"
    os.rename(path, target)
    return target


def repair_log(table_uri: str) -> Repair:
    """Move a torn last commit file (and stray checksum files past the last commit) into
    ``_delta_log/_quarantine/``; local tables only (an object store's PUT is atomic).

    Returns:
        What was moved; nothing when the log holds no such damage.

    Raises:
        StoreCorruptedError: a commit file other than the last one does not parse.
    """
    root = local_path(table_uri)
    log = Path(root) / "_delta_log" if root is not None else None
    if log is None or not log.is_dir():
        return Repair(())
    commits = _versions(log, COMMIT_FILE)
    # Newest first: the last file is the only one a crash may have torn.
    torn = [(v, p) for v, p in reversed(commits) if not commit_parses(p.read_bytes())]
    last = commits[-1][0] if commits else -1
    earlier = [p for v, p in torn if v != last]
    if earlier:
        damaged = earlier[-1]
        raise StoreCorruptedError(
            f"commit file {damaged} does not parse and is not the last commit of its table: committed "
            "data is unreadable; restore the file from a backup (the store repairs only a torn last "
            "commit, which no one can have read)",
            table=table_uri,
            path=str(damaged),
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved: list[tuple[str, str]] = []
    if torn:
        version, path = torn[0]
        original = path.read_bytes()
        target = _quarantine(log, path, stamp)
        if target.read_bytes() != original:
            # Another process freed the version and committed it between our look and our move:
            # that file is a good commit; put it back where it was.
            os.link(target, path)
            target.unlink()
        else:
            moved.append((str(path), str(target)))
            _log.warning(
                "table %s: last commit file %s is torn (does not parse; %d bytes), most likely by an "
                "OS crash or power loss; moved to %s. Version %d is free again",
                table_uri,
                path.name,
                len(original),
                target,
                version,
            )
        last = max((v for v, _ in commits if v != version), default=-1)
    for version, path in _versions(log, _CHECKSUM):
        if version > last:
            target = _quarantine(log, path, stamp)
            moved.append((str(path), str(target)))
            _log.warning(
                "table %s: checksum file %s has no commit; moved to %s", table_uri, path.name, target
            )
    moved += _repair_checkpoint(table_uri, log, {v for v, _ in commits}, stamp)
    return Repair(tuple(moved))


def _repair_checkpoint(table_uri: str, log: Path, commits: set[int], stamp: str) -> list[tuple[str, str]]:
    """Move a torn newest checkpoint (all its parts) and the hint to it aside, if the commits it
    summarizes since the previous checkpoint are all present."""
    parts: dict[int, list[Path]] = {}
    for version, path in _versions(log, _CHECKPOINT):
        parts.setdefault(version, []).append(path)
    if not parts:
        return []
    newest = max(parts)
    if all(parquet_readable(p) for p in parts[newest]):
        return []
    previous = max((v for v in parts if v < newest and all(map(parquet_readable, parts[v]))), default=-1)
    missing = [v for v in range(previous + 1, newest + 1) if v not in commits]
    if missing:
        raise StoreCorruptedError(
            f"checkpoint {parts[newest][0]} is torn and the commits it summarizes "
            f"({missing[0]}..{missing[-1]}) are no longer in the log; restore it from a backup",
            table=table_uri,
            path=str(parts[newest][0]),
        )
    moved = []
    hint = log / _LAST_CHECKPOINT
    for path in [*parts[newest], *([hint] if hint.exists() else [])]:
        target = _quarantine(log, path, stamp)
        moved.append((str(path), str(target)))
    _log.warning(
        "table %s: newest checkpoint (version %d) is torn; moved to %s with its hint, the log is read "
        "from %s",
        table_uri,
        newest,
        log / QUARANTINE_DIR,
        f"checkpoint {previous}" if previous >= 0 else "its first commit",
    )
    return moved
