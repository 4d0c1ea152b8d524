"""Consumer actions: the kinds of row a consumer records in the ``action_log`` table.

Consumers write them (QMQ's action log); the broker's pull-log and retry jobs read them. The claim
rules that evaluate them are :mod:`engine.protocol.lease_book`.
"""

from __future__ import annotations

PULL = "PULL"  # a range of a queue leased to one consumer until deadline_ms
ACK = "ACK"  # a range of a queue consumed
NACK = "NACK"  # consume later: the retry job re-puts the message
CHANGE_INVISIBLE = "CHANGE_INVISIBLE"  # a new invisible deadline for a leased message
OFFLINE = "OFFLINE"  # QMQ's FOREVER_OFFLINE: the consumer's leases end now, others take them at once
RELEASE = "RELEASE"  # leased messages never handed to the user: free again, no delivery counted
RESET = "RESET"  # the group's position in a queue moved to queue_offset (first lease, offset reset)
ACTIONS: frozenset[str] = frozenset({PULL, ACK, NACK, CHANGE_INVISIBLE, OFFLINE, RELEASE, RESET})
# A lease whose invisible deadline passed without an ack after the last delivery allowed: the
# consumer that finds it records it (reconsume_times = the failed delivery's) and the retry job
# dead-letters it. Not an action a consumer records through the action-log writer.
EXPIRED = "EXPIRED"
# The actions the retry job turns into retries or dead letters.
ROUTED_ACTIONS: frozenset[str] = frozenset({NACK, EXPIRED})
