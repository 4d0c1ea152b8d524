"""RocketMQ's remoting protocol over the store: a name server and a broker endpoint that unmodified
RocketMQ clients (4.x remoting) produce to and consume from. Every request runs the engine's own
calls (producer, pull consumer, offsets, membership, transactions, admin): one behaviour, two doors.

:mod:`engine.remoting.server` runs both ports; :mod:`engine.remoting.handlers` holds the requests'
handlers, one module per kind of request.
"""

from engine.remoting.server import RemotingServer

__all__ = ["RemotingServer"]
