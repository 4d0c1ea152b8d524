"""Request, response and flag codes of RocketMQ's remoting protocol (4.x / 5.x numbering)."""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    """The request codes this endpoint knows (``org.apache.rocketmq...RequestCode``)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    # The admin requests of mqadmin and the dashboard (engine.remoting.handlers.admin*).
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    QUERY_CONSUME_TIME_SPAN = 303
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    VIEW_BROKER_STATS_DATA = 315
    GET_BROKER_CONSUME_STATS = 317
    CLONE_GROUP_OFFSET = 314
    GET_ALL_PRODUCER_INFO = 328
    GET_NAMESRV_CONFIG = 319
    GET_KV_CONFIG = 101
    QUERY_CONSUME_QUEUE = 321
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    # Refused with a reason (see README's mqadmin table).
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    PUT_KV_CONFIG = 100
    DELETE_KV_CONFIG = 102
    WIPE_WRITE_PERM_OF_BROKER = 205
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    CLEAN_UNUSED_TOPIC = 316
    UPDATE_NAMESRV_CONFIG = 318
    ADD_WRITE_PERM_OF_BROKER = 327
    DELETE_EXPIRED_COMMITLOG = 329
    # Resets pushed to clients, request-reply (helper wire-clients).
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326


class ResponseCode(enum.IntEnum):
    """Response codes (``org.apache.rocketmq...ResponseCode``)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207  # a request forwarded to a client got no answer in time


class LanguageCode(enum.IntEnum):
    """The ``language`` of a command (its byte in the binary header serialization)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(enum.IntEnum):
    """How a command's header is serialized (the high byte of the header-length word)."""

    JSON = 0
    ROCKETMQ = 1


class PullSysFlag(enum.IntFlag):
    """Bits of a pull request's ``sysFlag`` (``PullSysFlag``)."""

    COMMIT_OFFSET = 1 << 0
    SUSPEND = 1 << 1
    SUBSCRIPTION = 1 << 2
    CLASS_FILTER = 1 << 3
    LITE_PULL = 1 << 4


class MessageSysFlag(enum.IntFlag):
    """Bits of a message's ``sysFlag`` (``MessageSysFlag``)."""

    COMPRESSED = 1 << 0
    MULTI_TAGS = 1 << 1
    TRANSACTION_PREPARED = 1 << 2
    TRANSACTION_COMMIT = 2 << 2
    TRANSACTION_ROLLBACK = 3 << 2
    BORNHOST_V6 = 1 << 4
    STOREHOST_V6 = 1 << 5


TRANSACTION_MASK = 3 << 2  # the two transaction bits of a sysFlag
RPC_RESPONSE = 1 << 0  # flag bit: the command is a response
RPC_ONEWAY = 1 << 1  # flag bit: the request wants no response
