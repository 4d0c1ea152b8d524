"""Finding stored messages without scanning the commit log (RocketMQ's ``viewMessage`` / ``queryMessage``).

- By offset msg id: the id holds the store id and the physical offset, so the message is one point
  read of the commit log (files chosen by their ``physical_offset`` statistics, then row groups). The
  offset names its commit-log shard (:mod:`engine.protocol.shards`), so only that shard is read.
- By key or uniq key: a lookup in the ``index`` table (built by the index job,
  :mod:`engine.broker.index`) pruned by file statistics on ``topic``, ``key`` and ``store_ts_ms`` and
  by row-group statistics inside the key-sorted files; then point reads by physical offset.

The index job runs apart from dispatch, so a look-up also reads the commit-log versions the index has
not reached yet (its high-water mark is the index's app transaction, per shard): a message is found
by key or unique id as soon as it is committed, whether or not the index job has run. That part is
bounded (:data:`UNINDEXED_SCAN_VERSIONS`, the newest versions of each shard); past the bound a unique
id is looked for by a scan of the commit log's ``uniq_key`` column, and a key query says it is
incomplete (:attr:`KeyQueryResult.complete`) instead of answering a silent partial list.

Why not index in the dispatch step, as RocketMQ's ``CommitLogDispatcherBuildIndex`` does: dispatch
runs on every tick of the broker loop (every 20 ms) and bounds send-to-pullable latency; one more
Delta commit (two files) per dispatch would double its commits and fill the index with tiny files.
Reading the few versions past the index's mark costs only the look-ups, which are rare.

Messages removed by retention are not returned even when an index row still points at them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine.errors import InvalidArgumentError, MessageNotFoundError, StoreError
from engine.model import MessageExt
from engine.protocol.message_ids import parse_msg_id
from engine.protocol.names import validate_topic_name
from engine.protocol.transactions import UNDISPATCHED_FLAGS
from engine.store import schemas
from engine.store.commit_log import read_commit_logs
from engine.store.consume_queue import QueueIndex
from engine.store.index import KIND_KEY, KIND_UNIQ_KEY, indexed_version
from engine.store.store import Store, sql_literal

DEFAULT_MAX_NUM = 32  # RocketMQ's default for a key query
MAX_MAX_NUM = 1024
# Commit-log versions of each shard past the index's high-water mark that a look-up reads (the
# newest ones). The index job indexes up to 1000 versions a pass, so a running broker stays within.
UNINDEXED_SCAN_VERSIONS = 1000
# What a look-up reads of a commit-log row it matches itself (bodies stay on disk).
_MATCH_COLUMNS = pa.schema(
    [
        schemas.COMMIT_LOG_SCHEMA.field(c)
        for c in ("topic", "physical_offset", "uniq_key", "keys", "store_ts_ms", "sys_flag")
    ]
)
_HIDDEN_FLAGS = pa.array(sorted(UNDISPATCHED_FLAGS), pa.int32())
_FOUND_SCHEMA = pa.schema([pa.field("physical_offset", pa.int64()), pa.field("store_ts_ms", pa.int64())])


class KeyQueryResult(list[MessageExt]):
    """The messages a key query found (a list, as before), and whether it saw every message.

    Attributes:
        complete: True when the look-up covered every committed message: the index, and every
            commit-log version the index has not reached. False when the index was more than
            :data:`UNINDEXED_SCAN_VERSIONS` versions behind: older unindexed messages may be missing
            (run the index job: ``jobs/index.py``, ``mq broker --once``).
        unread_versions: the commit-log versions (every shard) the look-up left unread.
    """

    def __init__(self, messages: list[MessageExt] | None = None, *, unread_versions: int = 0) -> None:
        super().__init__(messages or [])
        self.unread_versions = unread_versions

    @property
    def complete(self) -> bool:
        """Whether every committed message was looked at."""
        return self.unread_versions == 0


def _check_key(value: object, name: str) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise InvalidArgumentError(f"{name} {value!r} must be a non-empty string without whitespace")
    return value


def _check_time(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidArgumentError(f"{name} {value!r} must be an epoch-millisecond int >= 0 (64-bit)")
    return value


def _read_messages(index: QueueIndex, offsets: list[int]) -> list[MessageExt]:
    """Messages at ``offsets`` (in that order), leaving out those no longer in the commit log."""
    wanted = offsets
    while wanted:
        try:
            rows = index.messages(wanted)
        except StoreError as exc:
            missing = set(getattr(exc, "offsets", None) or ())
            if not missing:
                raise
            wanted = [p for p in wanted if p not in missing]
            continue
        return [MessageExt.from_row(r) for r in rows.to_pylist()]
    return []


def view_message(
    store: Store, msg_id: str, *, topic: str | None = None, index: QueueIndex | None = None
) -> MessageExt:
    """The stored message with id ``msg_id``: an offset msg id or a client unique id.

    As RocketMQ's ``viewMessage``: an offset id (:attr:`SendResult.offset_msg_id`,
    :attr:`MessageExt.offset_msg_id`: store id + physical offset) is one point read of the commit
    log, any topic, dispatched or not; anything else is taken as a client unique id
    (:attr:`SendResult.msg_id`, :attr:`MessageExt.msg_id`) and looked up in the ``index`` table and
    the commit-log versions it has not reached yet. Both are 32 hex characters.

    Args:
        store: the store.
        msg_id: an offset message id or a client unique id.
        topic: narrows a unique-id look-up to one topic (default: every topic; the first stored
            copy is returned when several share the id, e.g. a retry).
        index: a :class:`QueueIndex` to reuse (its cached commit-log file statistics).

    Raises:
        InvalidArgumentError: ``msg_id`` is not 32 hex characters, or is an offset id issued by
            another store and no unique id of this store.
        MessageNotFoundError: no such message (never written, or removed by retention).
    """
    store_id, physical = parse_msg_id(msg_id)
    reader = index or QueueIndex(store)
    if store_id == store.store_id:
        found = _read_messages(reader, [physical])
        if found and found[0].offset_msg_id == msg_id.upper() and (topic is None or found[0].topic == topic):
            return found[0]
    if topic is not None:
        validate_topic_name(topic)
    message = _first_message(reader, _uniq_key_offsets(store, topic, msg_id.upper()))
    if message is not None:
        return message
    if store_id != store.store_id:
        raise InvalidArgumentError(
            f"msg_id {msg_id!r} is no unique id stored here and, as an offset id, belongs to store "
            f"{store_id}, not to this store ({store.store_id}); look it up in the store that issued it",
            msg_id=msg_id,
        )
    raise MessageNotFoundError(
        f"no message is stored at physical offset {physical} (msg_id {msg_id!r}: never written or "
        "removed by retention), nor is it the unique id of a stored message (not sent, or removed)",
        msg_id=msg_id,
        physical_offset=physical,
    )


def index_lookup(
    store: Store,
    topic: str | None,
    kind: str,
    key: str,
    begin_ms: int | None = None,
    end_ms: int | None = None,
) -> pa.Table:
    """Index rows (``physical_offset``, ``store_ts_ms``) of ``topic#key`` stored in ``[begin, end]``
    (of ``key`` in any topic when ``topic`` is None).

    Files are pruned by their statistics, row groups by the parquet footers; no other file is read.
    """
    predicate = f"key = {sql_literal(key)} AND kind = {sql_literal(kind)}"
    row_filter = (ds.field("key") == key) & (ds.field("kind") == kind)
    if topic is not None:
        predicate = f"topic = {sql_literal(topic)} AND {predicate}"
        row_filter &= ds.field("topic") == topic
    if begin_ms is not None:
        predicate += f" AND store_ts_ms >= {int(begin_ms)}"
        row_filter &= ds.field("store_ts_ms") >= begin_ms
    if end_ms is not None:
        predicate += f" AND store_ts_ms <= {int(end_ms)}"
        row_filter &= ds.field("store_ts_ms") <= end_ms
    return store.read(
        schemas.INDEX, predicate=predicate, filter=row_filter, columns=["physical_offset", "store_ts_ms"]
    )


def unindexed_lookup(
    store: Store,
    topic: str | None,
    kind: str,
    key: str,
    begin_ms: int | None = None,
    end_ms: int | None = None,
    *,
    max_versions: int | None = None,
) -> tuple[pa.Table, int]:
    """What :func:`index_lookup` would find in the commit-log versions the index has not reached.

    Reads, per shard, the versions after the index's high-water mark, at most ``max_versions``
    (default :data:`UNINDEXED_SCAN_VERSIONS`) of the newest, and matches them as the index job
    would index them (transaction halves and rolled-back messages are not).

    Returns:
        The matches (``physical_offset``, ``store_ts_ms``) and how many versions (every shard) were
        left unread: 0 when the look-up saw every committed message.
    """
    bound = UNINDEXED_SCAN_VERSIONS if max_versions is None else max_versions
    parts: list[pa.Table] = []
    unread = 0
    for shard, table in enumerate(store.commit_logs):
        covered = indexed_version(store, shard)  # read first: what is indexed later is read here too
        latest = store.version(table)
        if latest <= covered:
            continue
        first = max(covered + 1, latest - bound + 1)
        if first > latest:  # a bound of 0: nothing read past the index
            unread += latest - covered
            continue
        try:
            rows, _ = next(iter(store.versions_after(table, first - 1, _MATCH_COLUMNS, max_versions=bound)))
        except StoreError:  # a version's files vacuumed before the index got to them
            unread += latest - covered
            continue
        unread += first - covered - 1
        parts.append(_matches(rows, topic, kind, key, begin_ms, end_ms))
    return (pa.concat_tables(parts) if parts else _FOUND_SCHEMA.empty_table()), unread


def _matches(
    rows: pa.Table, topic: str | None, kind: str, key: str, begin_ms: int | None, end_ms: int | None
) -> pa.Table:
    """Rows of ``rows`` the index would hold under ``topic#key`` of ``kind``; pure."""
    keep = pc.invert(pc.is_in(rows["sys_flag"], value_set=_HIDDEN_FLAGS))
    if topic is not None:
        keep = pc.and_(keep, pc.equal(rows["topic"], topic))
    if begin_ms is not None:
        keep = pc.and_(keep, pc.greater_equal(rows["store_ts_ms"], begin_ms))
    if end_ms is not None:
        keep = pc.and_(keep, pc.less_equal(rows["store_ts_ms"], end_ms))
    if kind == KIND_UNIQ_KEY:
        keep = pc.and_(keep, pc.equal(rows["uniq_key"], key))
    else:
        keys = rows["keys"].combine_chunks()
        owners = pc.list_parent_indices(keys).filter(pc.equal(pc.list_flatten(keys), key))
        has_key = pc.is_in(pa.array(range(rows.num_rows), pa.int64()), value_set=pc.cast(owners, pa.int64()))
        keep = pc.and_(keep, has_key)
    picked = rows.filter(pc.fill_null(keep, False))
    return picked.select(["physical_offset", "store_ts_ms"]).cast(_FOUND_SCHEMA)


def _uniq_key_offsets(store: Store, topic: str | None, key: str) -> list[int]:
    """Physical offsets of the messages with unique id ``key`` (in ``topic`` when given), oldest
    first: the index, the versions it has not reached, and past the look-up's bound a scan of the
    commit log's ``uniq_key`` column (so a unique id is always found)."""
    unindexed, unread = unindexed_lookup(store, topic, KIND_UNIQ_KEY, key)
    rows = pa.concat_tables([index_lookup(store, topic, KIND_UNIQ_KEY, key).cast(_FOUND_SCHEMA), unindexed])
    if rows.num_rows == 0 and unread:
        row_filter = ds.field("uniq_key") == key
        if topic is not None:
            row_filter &= ds.field("topic") == topic
        rows = read_commit_logs(store, filter=row_filter, columns=["physical_offset"])
    return _offsets(rows, newest_first=False)


def _first_message(reader: QueueIndex, offsets: list[int]) -> MessageExt | None:
    """The first of the messages at ``offsets`` still in the commit log."""
    for offset in offsets:
        hits = _read_messages(reader, [offset])
        if hits:
            return hits[0]
    return None


def _offsets(rows: pa.Table, newest_first: bool) -> list[int]:
    ordered = sorted(int(p) for p in pc.unique(rows["physical_offset"]).to_pylist())
    return ordered[::-1] if newest_first else ordered


def query_by_key(
    store: Store,
    topic: str,
    key: str,
    begin_ms: int,
    end_ms: int,
    max_num: int = DEFAULT_MAX_NUM,
    *,
    index: QueueIndex | None = None,
) -> KeyQueryResult:
    """Messages of ``topic`` with business key ``key`` stored between ``begin_ms`` and ``end_ms``.

    As RocketMQ's key query: at most ``max_num`` messages, the most recent ones when more match
    (its index walks back from the newest entry); they are returned in store order. Messages the
    index job has not indexed yet are found too (see the module docstring); when the index is too
    far behind for that, the result says so (:attr:`KeyQueryResult.complete` False).

    Args:
        store: the store.
        topic: the topic the messages were stored in.
        key: one of the messages' keys (:attr:`Message.keys`).
        begin_ms: earliest store time, inclusive (epoch milliseconds).
        end_ms: latest store time, inclusive.
        max_num: most messages returned, 1..1024 (default 32).
        index: a :class:`QueueIndex` to reuse.

    Raises:
        InvalidTopicError: a malformed topic name.
        TopicNotFoundError: no such topic.
        InvalidArgumentError: an empty key or one with whitespace, a bad time range or ``max_num``.
    """
    validate_topic_name(topic)
    _check_key(key, "key")
    _check_time(begin_ms, "begin_ms")
    _check_time(end_ms, "end_ms")
    if begin_ms > end_ms:
        raise InvalidArgumentError(
            f"begin_ms {begin_ms} is after end_ms {end_ms}", begin_ms=begin_ms, end_ms=end_ms
        )
    if isinstance(max_num, bool) or not isinstance(max_num, int) or not 1 <= max_num <= MAX_MAX_NUM:
        raise InvalidArgumentError(f"max_num {max_num!r} must be 1..{MAX_MAX_NUM}", max_num=max_num)
    store.topic(topic)
    unindexed, unread = unindexed_lookup(store, topic, KIND_KEY, key, begin_ms, end_ms)
    indexed = index_lookup(store, topic, KIND_KEY, key, begin_ms, end_ms).cast(_FOUND_SCHEMA)
    rows = pa.concat_tables([indexed, unindexed])
    reader = index or QueueIndex(store)
    found: list[MessageExt] = []
    candidates = _offsets(rows, newest_first=True)
    # Most recent first, in slices: a slice short of max_num (retention removed some) reads the next.
    while candidates and len(found) < max_num:
        take, candidates = candidates[: max_num - len(found)], candidates[max_num - len(found) :]
        found += _read_messages(reader, take)
    return KeyQueryResult(sorted(found, key=lambda m: m.physical_offset), unread_versions=unread)


def query_by_uniq_key(
    store: Store, topic: str, uniq_key: str, *, index: QueueIndex | None = None
) -> MessageExt | None:
    """The message of ``topic`` with client unique id ``uniq_key`` (:attr:`SendResult.msg_id`); an
    offset msg id (:attr:`SendResult.offset_msg_id`) of a message in ``topic`` is accepted too.

    When several copies share the id in the topic (a resend), the first stored one is returned.

    Returns:
        The message, or None when there is no such message (not sent, or removed by retention).
        Messages not indexed yet are found too.

    Raises:
        InvalidTopicError: a malformed topic name.
        TopicNotFoundError: no such topic.
        InvalidArgumentError: an empty uniq key or one with whitespace.
    """
    validate_topic_name(topic)
    _check_key(uniq_key, "uniq_key")
    store.topic(topic)
    reader = index or QueueIndex(store)
    try:
        store_id, physical = parse_msg_id(uniq_key)
    except InvalidArgumentError:
        store_id, physical = "", -1  # not an offset id: an index look-up only
    if store_id == store.store_id:
        found = _read_messages(reader, [physical])
        if found and found[0].offset_msg_id == uniq_key.upper() and found[0].topic == topic:
            return found[0]
    return _first_message(reader, _uniq_key_offsets(store, topic, uniq_key))


def find_message(store: Store, msg_id: str, *, index: QueueIndex | None = None) -> MessageExt:
    """The message with offset msg id or client unique id ``msg_id``, in any topic (RocketMQ's
    ``viewMessage`` accepts both kinds). A uniq key is looked up in the index and the commit-log
    versions it has not reached (past the bound, a scan of the ``uniq_key`` column); several copies
    (a retry, a delayed message's re-put) give the first stored.

    Raises:
        InvalidArgumentError: an empty id or one with whitespace.
        MessageNotFoundError: no stored message has that id.
    """
    _check_key(msg_id, "msg_id")
    reader = index or QueueIndex(store)
    try:  # offset ids and uniq keys are both 32 hex characters: try the offset first
        store_id, _ = parse_msg_id(msg_id)
    except InvalidArgumentError:
        store_id = ""
    if store_id == store.store_id:
        try:
            return view_message(store, msg_id, index=reader)
        except MessageNotFoundError:
            pass
    found = _first_message(reader, _uniq_key_offsets(store, None, msg_id))
    if found is None:  # not a message consumers see (a transaction half): the raw log has it
        scanned = read_commit_logs(store, filter=ds.field("uniq_key") == msg_id, columns=["physical_offset"])
        found = _first_message(reader, _offsets(scanned, newest_first=False)[:1])
    if found is not None:
        return found
    raise MessageNotFoundError(
        f"no message with id {msg_id!r} is stored (an offset msg id or a uniq key; never written, or "
        "removed by retention)",
        msg_id=msg_id,
    )


def query_by_time(
    store: Store,
    topic: str,
    begin_ms: int,
    end_ms: int,
    max_num: int = DEFAULT_MAX_NUM,
    *,
    index: QueueIndex | None = None,
) -> list[MessageExt]:
    """Dispatched messages of ``topic`` stored in ``[begin_ms, end_ms)``, the oldest ``max_num``,
    in store order (the RocketMQ dashboard's search by topic and time).

    Each queue's range is found by binary search on store times
    (:class:`~engine.client.admin_offsets.QueueTimeIndex`), then read as a pull reads it.

    Raises:
        InvalidTopicError: a malformed topic name.
        TopicNotFoundError: no such topic.
        InvalidArgumentError: a bad time range or ``max_num``.
    """
    from engine.client.admin_offsets import QueueTimeIndex

    validate_topic_name(topic)
    _check_time(begin_ms, "begin_ms")
    _check_time(end_ms, "end_ms")
    if begin_ms > end_ms:
        raise InvalidArgumentError(
            f"begin_ms {begin_ms} is after end_ms {end_ms}", begin_ms=begin_ms, end_ms=end_ms
        )
    if isinstance(max_num, bool) or not isinstance(max_num, int) or not 1 <= max_num <= MAX_MAX_NUM:
        raise InvalidArgumentError(f"max_num {max_num!r} must be 1..{MAX_MAX_NUM}", max_num=max_num)
    config = store.topic(topic)
    times = QueueTimeIndex(store)
    reader = index or QueueIndex(store)
    reader.refresh()
    found: list[MessageExt] = []
    for qid in range(config.queues):
        low = times.offset_for_time(topic, qid, begin_ms)
        high = times.offset_for_time(topic, qid, end_ms)
        if high > low:
            entries = reader.entries(topic, qid, low, min(high, low + max_num))
            found += _read_messages(reader, [int(p) for p in entries["physical_offset"].to_pylist()])
    found.sort(key=lambda m: (m.store_ts_ms, m.physical_offset))
    return found[:max_num]
