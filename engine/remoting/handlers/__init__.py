"""The request handlers of RocketMQ's wire protocol, one module per kind of request.

``send`` (SEND_MESSAGE, batches, CONSUMER_SEND_MSG_BACK), ``pull`` (PULL_MESSAGE), ``offsets``
(consumer and queue offsets), ``clients`` (heartbeats, consumer lists, queue locks), ``queries``
(look-ups and topic administration) and ``transactions`` (END_TRANSACTION, the check-back) answer on
the broker's port; ``namesrv`` answers the name server's requests (routes, cluster info, topic list).

Each module maps request codes to its handlers in a ``HANDLERS`` dict (``code -> async (ctx, conn,
cmd) -> response``); :mod:`engine.remoting.server` merges the broker modules' dicts into its broker
table and serves ``namesrv.HANDLERS`` on the name server's port.
"""
