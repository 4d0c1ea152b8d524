"""Options of the ``mq`` data source (reads and writes), parsed and validated in one place.

Spark passes options as strings under any key case. Every bad value is an
:class:`~engine.errors.InvalidArgumentError` naming the option and what it accepts.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.config import load_config
from engine.errors import InvalidArgumentError, StoreError
from engine.protocol import validate_group_name, validate_topic_name
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.store import schemas
from engine.store.commit_markers import sink_app
from engine.store.delta import open_snapshot
from engine.store.store import Store

SHORT_NAME = "mq"
# A position in a topic: a named end, an epoch-ms store time, or explicit queue offsets.
Position = Literal["earliest", "latest"] | int | dict[int, int]
DEFAULT_ENTRIES_PER_PARTITION = 65_536
_SINK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")

_stores: dict[StoreRef, Store] = {}
_readers: dict[StoreRef, Store] = {}
_stores_lock = threading.Lock()


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidArgumentError(f"mq option {name} must be an integer, got {raw!r}", option=name) from None
    if value < minimum:
        raise InvalidArgumentError(f"mq option {name} must be >= {minimum}, got {value}", option=name)
    return value


def parse_position(raw: str | None, name: str, default: Position) -> Position:
    """``earliest``, ``latest``, an epoch-millisecond time, or queue offsets as JSON.

    The JSON is the source's own offset (``{"q": {"0": 5, "1": 3}}``) or just ``{"0": 5, "1": 3}``:
    queue id -> offset; queues left out take the option's default end.

    Raises:
        InvalidArgumentError: anything else.
    """
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    if re.fullmatch(r"\d+", text):
        return int(text)
    allowed = f"mq option {name} must be 'earliest', 'latest', an epoch-ms time or JSON like "
    allowed += '{"q": {"0": 12, "1": 7}}'
    try:
        decoded = json.loads(text)
    except json.JSONDecodeError:
        raise InvalidArgumentError(f"{allowed}; got {raw!r}", option=name) from None
    if isinstance(decoded, dict) and set(decoded) == {"q"}:
        decoded = decoded["q"]
    if not isinstance(decoded, dict):
        raise InvalidArgumentError(f"{allowed}; got {raw!r}", option=name)
    offsets: dict[int, int] = {}
    for key, value in decoded.items():
        try:
            qid = int(key)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{allowed}; queue id {key!r} is not an int", option=name) from None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or qid < 0:
            raise InvalidArgumentError(f"{allowed}; queue {key}: offset {value!r} is not an int >= 0")
        offsets[qid] = value
    return offsets


def storage_options_option(options: Mapping[str, str], source: str = SHORT_NAME) -> dict[str, str] | None:
    """The ``storageOptions`` option (a JSON object, delta-rs storage options) of a data source,
    from its options with lower-cased keys; None when not given.

    Raises:
        InvalidArgumentError: not a JSON object.
    """
    raw = options.get("storageoptions")
    if not raw:
        return None
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{source} option storageOptions is not JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise InvalidArgumentError(f"{source} option storageOptions must be a JSON object")
    return {str(k): str(v) for k, v in decoded.items()}


def _store_path(options: Mapping[str, str]) -> str:
    path = options.get("store") or options.get("path")
    if not path:
        raise InvalidArgumentError("mq needs option 'store' (the store's directory or URI)", option="store")
    if "://" in path and not path.startswith("file://"):
        return path.rstrip("/")
    return str(Path(path.removeprefix("file://")).resolve())


class ReadingStore(Store):
    """A store as a Spark task reads it: opened without creating, checking or repairing a table
    (what :meth:`Store.open` does on the driver once), so a task costs only what it reads.

    Its commit-log shards are read from the commit log's properties on first use.
    """

    def __init__(self, root: str, storage_options: Mapping[str, str] | None) -> None:
        super().__init__(root, storage_options, load_config())
        self._found_shards: int | None = None

    @property
    def commit_log_shards(self) -> int:
        """The commit-log shards the store was created with (read once, from its commit log)."""
        if self._found_shards is None:
            snap = open_snapshot(self.uri(schemas.COMMIT_LOG), self.storage_options, name=schemas.COMMIT_LOG)
            recorded = snap.configuration().get(schemas.SHARDS_PROPERTY)
            self._found_shards = int(recorded) if recorded else 1
        return self._found_shards

    @property
    def commit_logs(self) -> tuple[str, ...]:
        """The table names of the commit-log shards, shard 0 first."""
        return tuple(schemas.commit_log_table(k) for k in range(self.commit_log_shards))


@dataclass(frozen=True)
class StoreRef:
    """Where a store is: hashable and picklable, so executors can open it (once per process)."""

    root: str
    storage: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, root: str, storage_options: Mapping[str, str] | None = None) -> StoreRef:
        """A reference to the store at ``root``. For an object-store root the options are complete
        here, on the driver: the config's (``[storage]``, ``MQ_STORAGE_*``, ``AWS_*``) under
        ``storage_options``, so executors, whose environment may hold none, reach the same store."""
        options = dict(storage_options or {})
        if "://" in root and not root.startswith("file://"):
            options = {**load_config().storage, **options}
        return cls(root, tuple(sorted(options.items())))

    @property
    def storage_options(self) -> dict[str, str] | None:
        return dict(self.storage) or None

    def open(self) -> Store:
        """The store, opened once per Python process (driver worker or executor) and reused.

        Raises:
            StoreError: a local path that holds no store (a typo must not create an empty store).
        """
        with _stores_lock:
            store = _stores.get(self)
            if store is None:
                self._check_local()
                store = Store.open(self.root, self.storage_options, load_config())
                _stores[self] = store
            return store

    def reader(self) -> Store:
        """The store as a task reads it (:class:`ReadingStore`: no table created or checked), once
        per Python process and reused: what executors open.

        Raises:
            StoreError: a local path that holds no store.
        """
        with _stores_lock:
            store = _readers.get(self)
            if store is None:
                self._check_local()
                store = ReadingStore(self.root, self.storage_options)
                _readers[self] = store
            return store

    def _check_local(self) -> None:
        if "://" not in self.root or self.root.startswith("file://"):
            local = Path(self.root.removeprefix("file://"))
            if not (local / schemas.COMMIT_LOG / "_delta_log").is_dir():
                raise StoreError(f"mq: no store at {self.root} (no commit_log table)", path=self.root)


@dataclass(frozen=True)
class ReadOptions:
    """Options of ``spark.read.format("mq")`` and ``spark.readStream.format("mq")``.

    Attributes:
        store: where the store is.
        topic: the topic read.
        group: stream: the group whose offsets start the stream and are committed after each batch.
        expression: the selector's text: a tag expression (``*``, ``TagA || TagB``) or, with
            ``expressionType`` ``SQL92``, a SQL92 condition on message properties
            (``region = 'eu' AND amount > 100``), as RocketMQ's ``MessageSelector``.
        expression_type: option ``expressionType``, ``TAG`` (default) or ``SQL92``.
        starting: where to start (stream default ``latest``, batch default ``earliest``).
        ending: batch: where to stop, exclusive (default ``latest``).
        start_time / end_time: batch: store-time bounds ``[start_time, end_time)`` in epoch ms.
        max_messages_per_trigger: stream: most queue entries per micro-batch (over all queues).
        as_of_version: batch: read the topic as it stood at this commit-log version (a store with
            one commit-log shard only: shards have versions of their own).
        consumed_by: batch: only messages this group has consumed (below its committed offsets).
        entries_per_partition: queue entries one Spark task reads at most.
    """

    store: StoreRef
    topic: str
    group: str | None = None
    expression: str = "*"
    expression_type: ExpressionType = ExpressionType.TAG
    starting: Position | None = None
    ending: Position | None = None
    start_time: int | None = None
    end_time: int | None = None
    max_messages_per_trigger: int | None = None
    as_of_version: int | None = None
    consumed_by: str | None = None
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION

    @property
    def selector(self) -> MessageSelector:
        """The read's message selector (``expression`` read as ``expression_type``)."""
        return MessageSelector.parse(self.expression_type, self.expression)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        """Parse and check; stream-only and batch-only options are refused in the other mode.

        Raises:
            InvalidArgumentError: a missing or bad option, or options that contradict each other.
        """
        o = _lowered(options)
        topic = o.get("topic")
        if not topic:
            raise InvalidArgumentError("mq needs option 'topic'", option="topic")
        validate_topic_name(topic)
        group = o.get("group") or None
        if group is not None:
            validate_group_name(group)
        consumed_by = o.get("consumedby") or None
        if consumed_by is not None:
            validate_group_name(consumed_by)
        expression = o.get("expression", "*")
        expression_type = MessageSelector.parse(o.get("expressiontype", "TAG"), expression).type
        mode = "streaming" if streaming else "batch"
        only = (
            ("endingOffsets", "startTime", "endTime", "asOfVersion", "consumedBy")
            if streaming
            else ("group", "maxMessagesPerTrigger")
        )
        for name in only:
            if name.lower() in o:
                raise InvalidArgumentError(f"mq option {name} is not for {mode} reads", option=name)
        starting = parse_position(
            o.get("startingoffsets"), "startingOffsets", "latest" if streaming else "earliest"
        )
        ending = parse_position(o.get("endingoffsets"), "endingOffsets", "latest")
        start_time = _int(o, "startTime", 0)
        end_time = _int(o, "endTime", 0)
        if not streaming:
            if starting == "latest":
                raise InvalidArgumentError("mq batch reads cannot start at 'latest' (nothing to read)")
            if ending == "earliest":
                raise InvalidArgumentError("mq batch reads cannot end at 'earliest' (nothing to read)")
            if start_time is not None and "startingoffsets" in o:
                raise InvalidArgumentError("mq options startTime and startingOffsets exclude each other")
            if end_time is not None and "endingoffsets" in o:
                raise InvalidArgumentError("mq options endTime and endingOffsets exclude each other")
            if start_time is not None and end_time is not None and end_time < start_time:
                raise InvalidArgumentError(f"mq option endTime {end_time} is before startTime {start_time}")
        return cls(
            store=StoreRef.of(_store_path(o), storage_options_option(o)),
            topic=topic,
            group=group,
            expression=expression,
            expression_type=expression_type,
            starting=starting,
            ending=None if streaming else ending,
            start_time=start_time,
            end_time=end_time,
            max_messages_per_trigger=_int(o, "maxMessagesPerTrigger", 1),
            as_of_version=_int(o, "asOfVersion", 0),
            consumed_by=consumed_by,
            entries_per_partition=_int(o, "entriesPerPartition", 1) or DEFAULT_ENTRIES_PER_PARTITION,
        )


@dataclass(frozen=True)
class WriteOptions:
    """Options of ``df.write.format("mq")`` and ``df.writeStream.format("mq")``.

    Attributes:
        store: where the store is.
        sink_id: names the sink's progress marker in the commit log (``mq.sink.<sinkId>``). Required
            for streams: Python sinks are not told their checkpoint, so the marker cannot be derived
            from it. One sinkId per query and checkpoint.
        batch_id: batch writes only, with ``sinkId``: makes a retried batch write a no-op.
    """

    store: StoreRef
    sink_id: str | None = None
    batch_id: int | None = None

    @property
    def app_id(self) -> str | None:
        return None if self.sink_id is None else sink_app(self.sink_id)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
        """Parse and check.

        Raises:
            InvalidArgumentError: no store, a stream without sinkId, a bad sinkId or batchId.
        """
        o = _lowered(options)
        sink_id = o.get("sinkid") or None
        if sink_id is not None and not _SINK_ID.match(sink_id):
            raise InvalidArgumentError(
                f"mq option sinkId {sink_id!r} must be 1-200 characters of [A-Za-z0-9_.-]", option="sinkId"
            )
        batch_id = _int(o, "batchId", 0)
        if streaming:
            if sink_id is None:
                raise InvalidArgumentError(
                    "mq streaming writes need option 'sinkId' (a name unique to this query and its "
                    "checkpoint): it marks the batches already written, for exactly-once",
                    option="sinkId",
                )
            if batch_id is not None:
                raise InvalidArgumentError("mq option batchId is for batch writes only", option="batchId")
        elif batch_id is not None and sink_id is None:
            raise InvalidArgumentError("mq option batchId needs sinkId too", option="batchId")
        return cls(StoreRef.of(_store_path(o), storage_options_option(o)), sink_id, batch_id)
