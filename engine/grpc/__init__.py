"""RocketMQ 5's door: the gRPC ``MessagingService`` (apache/rocketmq-apis, ``apache.rocketmq.v2``)
that every 5.x client speaks to a proxy, over the store.

- :mod:`.v2`: the stubs, generated from :file:`engine/grpc/protos` by ``bin/gen-grpc-stubs.sh``
  (committed; a test checks they match the protos), their descriptors in a private pool
  (``engine.grpc.v2._pool``) so the official 5.x Python client imports beside them.
- :mod:`.server` (:class:`GrpcServer`: what the door answers, its lifecycle, clients and consumers),
  :mod:`.service` (the calls), :mod:`.statuses` (RocketMQ 5's codes for the engine's errors),
  :mod:`.unparsable` (requests whose bytes are not their protobuf message), :mod:`.messages`
  (protobuf <-> engine messages), :mod:`.telemetry` (the open Telemetry streams, server commands
  and their answers), :mod:`.transactions` (half messages, EndTransaction, the check-back).
"""

from __future__ import annotations

from engine.grpc.server import DEFAULT_PORT, GrpcServer

__all__ = ["DEFAULT_PORT", "GrpcServer"]
