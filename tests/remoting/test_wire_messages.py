"""What a client's properties become: the engine's message fields, kept, broker-owned and dropped."""

from __future__ import annotations

import pytest

from engine.errors import InvalidMessageError
from engine.remoting.wire_messages import incoming


def test_a_clients_properties_are_split_into_the_engines_fields() -> None:
    item = incoming(
        "T",
        b"body",
        {
            "TAGS": "TagA",
            "KEYS": "k1  k2",
            "UNIQ_KEY": "ABC",
            "DELAY": "3",
            "TRAN_MSG": "TRUE",
            "PGROUP": "pg",
            "WAIT": "true",  # reserved: the broker's, dropped
            "__BORNHOST": "6.6.6.6:1",  # broker-owned: a client may not set it
            "CORRELATION_ID": "c-1",  # a request's, kept for its reply
            "TIMER_DELAY_SEC": "10",  # a timer request: the user's
            "color": "red",
        },
        born_host=("10.0.0.1", 4242),
        flag=7,
        born_ts_ms=1234,
    )
    m = item.message
    assert (m.topic, m.body, m.tags, tuple(m.keys)) == ("T", b"body", "TagA", ("k1", "k2"))
    assert dict(m.properties) == {"TIMER_DELAY_SEC": "10", "color": "red"}
    assert (item.uniq_key, item.delay_level, item.transactional, item.producer_group) == (
        "ABC",
        3,
        True,
        "pg",
    )
    assert item.born_ts_ms == 1234
    assert dict(item.extra) == {"WAIT": "true", "__BORNHOST": "6.6.6.6:1"}
    assert dict(item.broker_properties) == {
        "CORRELATION_ID": "c-1",
        "__BORNHOST": "10.0.0.1:4242",
        "__FLAG": "7",
    }


def test_a_plain_message_takes_nothing_it_was_not_given() -> None:
    item = incoming("T", b"x", {"UNIQ_KEY": "U", "WAIT": "true"}, born_host=("::1", 1))
    assert (item.message.tags, tuple(item.message.keys), dict(item.message.properties)) == (None, (), {})
    assert (item.uniq_key, item.delay_level, item.transactional, item.producer_group) == ("U", 0, False, None)
    assert item.born_ts_ms is None  # not told: the broker's now
    assert dict(item.broker_properties) == {}  # no IPv4 born host, flag 0
    assert dict(incoming("T", b"x", {"DELAY": "-2"}).message.properties) == {}
    assert incoming("T", b"x", {"DELAY": "-2"}).delay_level == 0


def test_a_delay_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="DELAY"):
        incoming("T", b"x", {"DELAY": "soon"})
