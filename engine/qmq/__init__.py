"""QMQ's door over the store: a meta-server locator (HTTP), a meta server and a broker that
unmodified QMQ clients (``com.qunar.qmq:qmq``) register with, send to, pull from and ack to.

:mod:`engine.qmq.codec` is QMQ's wire codec, :mod:`engine.qmq.server` the endpoint,
:mod:`engine.qmq.pull_sequences` the consumers' pull-log sequences, :mod:`engine.qmq.messages`
the mapping of QMQ messages to the store's.
"""

from engine.qmq.server import QmqServer

__all__ = ["QmqServer"]
