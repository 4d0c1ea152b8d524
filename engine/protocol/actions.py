"""Consumer actions: the kinds of row a consumer records in the ``action_log`` table.

Consumers write them (QMQ's action log); the broker's pull-log and retry jobs read them.
"""

from __future__ import annotations

PULL = "PULL"  # a range of a queue leased to one consumer
ACK = "ACK"
NACK = "NACK"  # consume later: the retry job re-puts the message
CHANGE_INVISIBLE = "CHANGE_INVISIBLE"  # a new invisible deadline for a leased message
OFFLINE = "OFFLINE"
ACTIONS: frozenset[str] = frozenset({PULL, ACK, NACK, CHANGE_INVISIBLE, OFFLINE})
# A lease whose invisible deadline passed without an ack. No consumer writes it through the
# action-log writer today; the retry job routes it as it routes a NACK.
EXPIRED = "EXPIRED"
# The actions the retry job turns into retries or dead letters.
ROUTED_ACTIONS: frozenset[str] = frozenset({NACK, EXPIRED})
