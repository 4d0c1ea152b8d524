"""Index keys: the kinds of lookup key the ``index`` table holds for a stored message (as RocketMQ's
IndexService: its business keys, and its client unique id)."""

from __future__ import annotations

KIND_KEY = "KEY"  # one row per business key of the message (``Message.keys``)
KIND_UNIQ_KEY = "UNIQ_KEY"  # one row for the client unique id (the id consumers see)
