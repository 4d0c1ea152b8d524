"""Plain appends committed directly (engine.store.delta.blind_appends): what Delta readers see of them,
racing writers, and the commits that must send a writer back to a fresh snapshot or to delta-rs."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import engine.store.delta.direct_append as direct_append
from engine import Store, StoreError
from engine.store import schemas

TABLE = schemas.CONSUMER_OFFSET


def _rows(*offsets: int, group: str = "g") -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"group": group, "topic": "T", "queue_id": 0, "offset": o, "ts_ms": o, "consumer_id": ""}
            for o in offsets
        ],
        schema=schemas.CONSUMER_OFFSET_SCHEMA,
    )


def _log(store: Store) -> Path:
    return Path(store.uri(TABLE)) / "_delta_log"


def _commit_info(store: Store, version: int) -> dict[str, Any]:
    lines = (_log(store) / f"{version:020d}.json").read_text().splitlines()
    return next(json.loads(line)["commitInfo"] for line in lines if "commitInfo" in line)


def _offsets(store: Store) -> list[int]:
    return sorted(DeltaTable(store.uri(TABLE)).to_pyarrow_table(columns=["offset"])["offset"].to_pylist())


def test_a_plain_append_is_committed_directly_and_read_by_delta_rs(store: Store) -> None:
    before = store.version(TABLE)
    version = store.append(TABLE, _rows(1, 2), custom_metadata={"mq.note": "x"})
    assert version == before + 1 == store.version(TABLE)
    info = _commit_info(store, version)
    assert (info["engineInfo"], info["operation"], info["isBlindAppend"], info["mq.note"]) == (
        "lakemq",
        "WRITE",
        True,
        "x",
    )
    assert _offsets(store) == [1, 2]
    add = pa.table(DeltaTable(store.uri(TABLE)).get_add_actions(flatten=True)).to_pylist()[0]
    assert (add["num_records"], add["min.offset"], add["max.offset"]) == (2, 1, 2)
    assert store.read(TABLE)["offset"].to_pylist() == [1, 2]  # the shared snapshot catches up on read


def test_appends_with_an_app_transaction_or_switched_off_go_through_delta_rs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded = store.append(TABLE, _rows(1), app_id="mq.test", app_version=7)
    assert _commit_info(store, guarded).get("engineInfo") != "lakemq"
    assert store.app_version(TABLE, "mq.test") == 7
    monkeypatch.setenv("MQ_DIRECT_APPEND", "0")
    off = store.append(TABLE, _rows(2))
    assert _commit_info(store, off).get("engineInfo") != "lakemq"
    monkeypatch.delenv("MQ_DIRECT_APPEND")
    assert _commit_info(store, store.append(TABLE, _rows(3)))["engineInfo"] == "lakemq"
    assert _offsets(store) == [1, 2, 3]


def _append_many(root: str, worker: int, count: int) -> None:
    store = Store.open(root)
    for i in range(count):
        store.append(TABLE, _rows(worker * 1000 + i, group=f"g{worker}"))


def test_racing_processes_each_land_every_append_once(store: Store) -> None:
    before = store.version(TABLE)
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_append_many, args=(store.root, w, 15)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(120)
    assert [p.exitcode for p in workers] == [0, 0, 0, 0]
    assert _offsets(store) == sorted(w * 1000 + i for w in range(4) for i in range(15))
    assert DeltaTable(store.uri(TABLE)).version() == store.version(TABLE) == before + 60
    assert all(_commit_info(store, v)["engineInfo"] == "lakemq" for v in range(before + 1, before + 61))


def test_a_property_changed_by_another_writer_is_honoured(store: Store, tmp_path: Path) -> None:
    store.append(TABLE, _rows(0))  # the writer is made, with the table's interval of 10
    other = Store.open(store.root)
    other.snapshot(TABLE).set_properties({"delta.checkpointInterval": "3"})
    changed = store.version(TABLE)
    for i in range(1, 7):
        store.append(TABLE, _rows(i))
    due = [v for v in range(changed + 1, changed + 7) if v % 3 == 0]
    assert due and all((_log(store) / f"{v:020d}.checkpoint.parquet").exists() for v in due)
    assert _offsets(store) == list(range(7))


def test_a_table_that_asks_more_than_a_blind_append_goes_back_to_delta_rs(store: Store) -> None:
    store.append(TABLE, _rows(1))
    DeltaTable(store.uri(TABLE)).alter.add_constraint({"non_negative": "offset >= 0"})  # writer v3
    version = store.append(TABLE, _rows(2))
    assert _commit_info(store, version).get("engineInfo") != "lakemq"
    with pytest.raises(StoreError, match="failed validation"):
        store.append(TABLE, _rows(-1))  # the constraint is enforced: delta-rs checked it
    assert _offsets(store) == [1, 2]


def test_an_idle_writer_whose_next_commits_were_cleaned_up_commits_after_the_newest(store: Store) -> None:
    store.append(TABLE, _rows(0))
    idle = store.version(TABLE)
    busy = Store.open(store.root)
    for i in range(1, 25):
        busy.append(TABLE, _rows(i))
    latest = store.version(TABLE)
    checkpoint = latest - latest % 10
    assert (_log(store) / f"{checkpoint:020d}.checkpoint.parquet").exists()
    for v in range(idle + 1, checkpoint):  # what log cleanup removes once past the log retention
        (_log(store) / f"{v:020d}.json").unlink()
    assert store.append(TABLE, _rows(99)) == latest + 1
    assert DeltaTable(store.uri(TABLE)).version() == latest + 1
    assert _offsets(store) == [*range(25), 99]


def test_a_link_made_before_it_failed_is_acknowledged_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def made_then_failed(source: str, target: str, **kwargs: Any) -> None:
        real_link(source, target, **kwargs)
        raise OSError(errno.EIO, "Input/output error", target)

    before = store.version(TABLE)
    monkeypatch.setattr(direct_append.os, "link", made_then_failed)
    assert store.append(TABLE, _rows(1)) == before + 1
    monkeypatch.undo()
    assert store.append(TABLE, _rows(2)) == before + 2
    assert _offsets(store) == [1, 2]


def test_a_failed_link_commits_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def failed(source: str, target: str, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error", target)

    before = store.version(TABLE)
    monkeypatch.setattr(direct_append.os, "link", failed)
    with pytest.raises(StoreError, match="could not be written"):
        store.append(TABLE, _rows(1))
    monkeypatch.undo()
    assert store.version(TABLE) == before and _offsets(store) == []
    assert not list(_log(store).glob("_commit_*"))


def test_without_hard_links_appends_go_through_delta_rs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(source: str, target: str, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(direct_append.os, "link", no_links)
    version = store.append(TABLE, _rows(1))
    monkeypatch.undo()
    assert _commit_info(store, version).get("engineInfo") != "lakemq"
    assert _commit_info(store, store.append(TABLE, _rows(2))).get("engineInfo") != "lakemq"  # it stays
    assert _offsets(store) == [1, 2]
