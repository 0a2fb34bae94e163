"""redis-py's exceptions turned into delay_broker's, with a message that says what happened.

The same refusal reaches a client in several shapes: its own reply class (``ReadOnlyError``), a plain
``ResponseError`` whose text starts with the code (``NOREPLICAS ...``), or, raised inside a Lua script, the
code somewhere inside the script's error text (Redis 6.2 wraps it as ``Error running script ... -OOM ...``).
Redis Cluster adds client-side errors of redis-py's own (``RedisClusterException``). All end up here.
"""

from __future__ import annotations

import re

import redis
from redis.exceptions import RedisClusterException
from redis.sentinel import MasterNotFoundError

from .errors import (
    DelayBrokerError,
    InvalidDelay,
    NotEnoughReplicas,
    SlotMigrating,
    StoreDamaged,
    StoreFull,
    StoreLoading,
    StoreReadOnly,
    StoreRefused,
    StoreUnavailable,
    WrongNode,
)

_EXPLANATIONS: dict[str, tuple[type[StoreRefused], str]] = {
    "NOREPLICAS": (
        NotEnoughReplicas,
        "the master has fewer in-sync replicas than its min-replicas-to-write and refuses writes",
    ),
    "OOM": (StoreFull, "Redis is full (maxmemory reached, with nothing its policy may evict): nothing was written"),
    "READONLY": (
        StoreReadOnly,
        "the server is a read-only replica (a failover is under way, or the URL names a replica)",
    ),
    "LOADING": (StoreLoading, "Redis is loading its data set from disk and cannot serve yet"),
    "DAMAGED": (StoreDamaged, "the store's bookkeeping is damaged (a hand-made change)"),
    "LEASEGONE": (StoreRefused, "a far-tier mover stalled past its lease: nothing was moved, another mover takes over"),
    "MOVED": (
        WrongNode,
        "the key's slot lives on another Redis Cluster node (a URL naming one node of a cluster needs "
        "redis+cluster://; with a cluster client, the slot has just moved)",
    ),
    "ASK": (SlotMigrating, "the key's slot is migrating between Redis Cluster nodes (a reshard or rebalance)"),
    "CROSSSLOT": (WrongNode, "keys of one operation are in different Redis Cluster slots"),
    "CLUSTERDOWN": (WrongNode, "the Redis Cluster is down or does not serve this slot"),
    "TRYAGAIN": (
        SlotMigrating,
        "the keys' slot is migrating between Redis Cluster nodes (a reshard or rebalance) and they are not all on "
        "one node yet: nothing was done",
    ),
}
_CLUSTER_REPLIES: tuple[tuple[type[redis.RedisError], str], ...] = (
    # redis-py strips the code from these replies' text (a MovedError reads "3652 127.0.0.1:7001").
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)
# Where each version puts the code of an error a script's redis.call raised: first (7.x, 8.x), or after Redis
# 6.2's "Error running script (...): @user_script:49: @user_script: 49: -". Nowhere else: the rest of a message
# can hold user data (a schedule named "nightly-LOADING").
_CODE = re.compile(r"(?:^|@user_script: ?\d+: -)(" + "|".join(_EXPLANATIONS) + r")\b")


def slot_moving(error: BaseException) -> bool:
    """Whether a Redis Cluster refused a call before running it because its slot is migrating or has just moved:
    ``TRYAGAIN``, ``ASK``, a ``MOVED`` redis-py did not follow (a node's own client), redis-py's "TTL exhausted"
    once it has followed as many of those as it does, or its failure to follow an ``ASK`` to a new master (see
    :func:`ask_to_unknown_node`). Doing the call again is safe."""
    return (
        isinstance(error, (redis.exceptions.TryAgainError, redis.exceptions.AskError))
        or _exhausted(error)
        or ask_to_unknown_node(error)
    )


def ask_to_unknown_node(error: BaseException) -> bool:
    """Whether ``error`` is redis-py's ``AttributeError`` on an ``ASK`` to a node missing from its slot map
    (redis/redis-py#4015): a master just added owns no slot, so ``CLUSTER SLOTS`` does not list it, until the
    first slot has moved to it; redis-py looks the node up, finds none and fails before sending anything."""
    if not isinstance(error, AttributeError) or "redis_connection" not in str(error):
        return False
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None:
        return False
    frame = trace.tb_frame  # where it was raised: redis-py's, and the look-up of the node's connection
    return frame.f_code.co_name == "get_redis_connection" and frame.f_globals.get("__name__") == "redis.cluster"


def _exhausted(error: BaseException) -> bool:
    # redis-py raises it only when every try of the call was redirected or told to try again.
    return isinstance(error, redis.exceptions.ClusterError) and str(error).startswith("TTL exhausted")


_NO_LONGER_MASTER = re.compile(r"^(?:ERR )?(?:WAIT cannot be used with replica instances|UNBLOCKED\b)")


def no_longer_master(error: BaseException) -> bool:
    """Whether ``error`` says the node asked is a replica now (a failover demoted it): a ``WAIT`` is refused
    there, and one it was blocked in is unblocked."""
    return isinstance(error, redis.ResponseError) and _NO_LONGER_MASTER.match(str(error)) is not None


def translate(error: redis.RedisError | RedisClusterException, doing: str) -> DelayBrokerError:
    """The delay_broker error for a redis-py error raised while ``doing`` something."""
    text = str(error)
    if isinstance(error, redis.BusyLoadingError):
        return _refused("LOADING", doing, text)
    if isinstance(error, redis.ReadOnlyError):
        return _refused("READONLY", doing, text)
    if isinstance(error, redis.OutOfMemoryError):
        return _refused("OOM", doing, text)
    for kind, code in _CLUSTER_REPLIES:
        if isinstance(error, kind):
            return _refused(code, doing, f"{code} {text}")
    if isinstance(error, MasterNotFoundError):
        return StoreUnavailable(f"Redis unavailable during {doing}: {_sentinels_said(text)}")
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
        return StoreUnavailable(f"Redis unavailable during {doing}: {text}{_password_hint(text)}")
    if no_longer_master(error):
        return StoreUnavailable(f"Redis unavailable during {doing}: the master became a replica (failover): {text}")
    if isinstance(error, RedisClusterException):
        return WrongNode(f"Redis Cluster refused {doing}: {text}")
    if isinstance(error, redis.ResponseError):
        if "delay_broker: " in text:
            # The scripts' own input errors ("delay_broker: due time of ..."; key names have no space there).
            return InvalidDelay(text.split("delay_broker: ", 1)[1].strip())
        match = _CODE.search(text)
        if match:
            return _refused(match.group(1), doing, text)
    if _exhausted(error):
        return SlotMigrating(
            f"Redis Cluster refused {doing}: redirected or told to try again at every try, the slot is moving between "
            f"nodes (a reshard or rebalance): nothing was done ({text})"
        )
    if isinstance(error, redis.exceptions.ClusterError):
        return StoreUnavailable(f"Redis Cluster unavailable during {doing}: {text}")
    # A key of the wrong type, a missing permission: as Redis said it, with the key names it gave.
    return DelayBrokerError(f"Redis refused {doing}: {_unwrapped(text)}")


# redis-py names each Sentinel that failed by its client's whole repr: a thousand characters in redis-py 5+,
# ``Redis<ConnectionPool<Connection<host=h,port=p,db=0>>>`` before.
_SENTINEL_REPR = re.compile(
    r"<redis\.client\.Redis\(.*?host=([^,]+),port=(\d+).*?\)>\)>\)>"
    r"|Redis<ConnectionPool<Connection<host=([^,]+),port=(\d+)[^>]*>>>"
)


def _sentinels_said(text: str) -> str:
    """``No master found`` with each Sentinel as its address, and what to do when they want a password."""
    text = _SENTINEL_REPR.sub(lambda match: "Sentinel {}:{}".format(*filter(None, match.groups())), text)
    if "AuthenticationError" in text or "NOAUTH" in text or "WRONGPASS" in text:
        text += " (the Sentinels want a password of their own: add ?sentinel_password=... to the URL)"
    return text


_WANTS_PASSWORD = re.compile(r"Authentication required|NOAUTH|HELLO must be called with the client already auth")


def _password_hint(text: str) -> str:
    """Where a missing password goes: through Sentinel, redis-py 5+ says only that HELLO wants one."""
    if not _WANTS_PASSWORD.search(text):
        return ""
    return (
        " (the Redis server wants a password: put it in the URL, redis://:PASSWORD@host:port/0, or "
        "redis+sentinel://:PASSWORD@sentinel:port/service/0 for a master behind Sentinels)"
    )


def _refused(code: str, doing: str, text: str) -> StoreRefused:
    kind, explanation = _EXPLANATIONS[code]
    return kind(f"Redis refused {doing}: {explanation} ({code}: {_detail(text, code)})")


_SCRIPT_WRAPPING = re.compile(
    r"^(Error running script \(call to f_[0-9a-f]+\): )?(@user_script:\d+: )?(user_script:\d+: )?(ERR )?"
    r"|\s*script: [0-9a-f]+, on @user_script:\d+\.$"
)


def _unwrapped(text: str) -> str:
    """A script's own error without the place Redis adds (6.2 before it, 7 and 8 after it)."""
    return _SCRIPT_WRAPPING.sub("", text).strip() or text


def _detail(text: str, code: str) -> str:
    """The server's own words after the code, without Redis 6.2's script wrapping."""
    start = text.find(code)
    detail = text[start + len(code) :].strip(" :") if start >= 0 else text
    return detail.split(" script:", 1)[0].strip() or text


__all__ = ["ask_to_unknown_node", "no_longer_master", "slot_moving", "translate"]
