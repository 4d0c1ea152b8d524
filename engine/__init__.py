"""lakemq: RocketMQ and QMQ semantics on Delta Lake tables, with Spark as the broker.

The public names of the engine; everything else is internal.
"""

from engine.client.admin import Admin
from engine.client.admin_groups import GroupSummary, QueueProgress
from engine.client.offsets import ConsumeFrom
from engine.client.producer import Producer
from engine.client.pull import PullConsumer
from engine.client.push import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeResult,
    MessageListener,
    ProcessQueueInfo,
    PushConsumer,
)
from engine.client.queries import KeyQueryResult
from engine.client.simple import SimpleConsumer
from engine.client.trace import MessageTrace, TraceEvent, TraceKind
from engine.client.transaction import TransactionProducer
from engine.config import EngineConfig, load_config
from engine.errors import (
    BucketNotFoundError,
    CommitConflictError,
    CommitStateUnknownError,
    CommitTruncatedError,
    ConfigError,
    ConsumerClosedError,
    ConsumerError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidSelectorError,
    InvalidTopicError,
    MessageNotFoundError,
    MQError,
    OffsetOutOfRangeError,
    ProducerClosedError,
    StoreAccessDeniedError,
    StoreCorruptedError,
    StoreError,
    StoreUnreachableError,
    TopicExistsError,
    TopicInUseError,
    TopicNotFoundError,
    TopicShrinkError,
    TransactionError,
)
from engine.model import (
    Message,
    MessageExt,
    PullResult,
    PullStatus,
    QueueStats,
    SendResult,
    SendStatus,
    SysFlag,
    TopicConfig,
)
from engine.protocol.rebalance import MessageModel, MessageQueue
from engine.protocol.selectors import ExpressionType, MessageSelector
from engine.protocol.transactions import LocalTransactionState
from engine.remoting import RemotingServer
from engine.store import Store

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "BucketNotFoundError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "CommitTruncatedError",
    "ConfigError",
    "ConsumeConcurrentlyContext",
    "ConsumeFrom",
    "ConsumeOrderlyContext",
    "ConsumeResult",
    "ConsumerClosedError",
    "ConsumerError",
    "EngineConfig",
    "ExpressionType",
    "GroupSummary",
    "InvalidArgumentError",
    "InvalidMessageError",
    "InvalidSelectorError",
    "InvalidTopicError",
    "KeyQueryResult",
    "LocalTransactionState",
    "MQError",
    "Message",
    "MessageExt",
    "MessageListener",
    "MessageModel",
    "MessageNotFoundError",
    "MessageQueue",
    "MessageSelector",
    "MessageTrace",
    "OffsetOutOfRangeError",
    "ProcessQueueInfo",
    "Producer",
    "ProducerClosedError",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueProgress",
    "QueueStats",
    "RemotingServer",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "Store",
    "StoreAccessDeniedError",
    "StoreCorruptedError",
    "StoreError",
    "StoreUnreachableError",
    "SysFlag",
    "TopicConfig",
    "TopicExistsError",
    "TopicInUseError",
    "TopicNotFoundError",
    "TopicShrinkError",
    "TraceEvent",
    "TraceKind",
    "TransactionError",
    "TransactionProducer",
    "load_config",
]
