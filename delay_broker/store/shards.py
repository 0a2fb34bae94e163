"""The namespace's shards on one Redis: the client, the key sets, the shard count recorded in Redis, the Redis
clock, redis-py's errors as delay_broker's, and the relay that wakes promoters for any shard."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import redis
from redis.exceptions import RedisClusterException
from redis.sentinel import MasterNotFoundError

from ..connect import AnyRedis, is_cluster, master_address
from ..errors import ConfigurationError, DelayBrokerError, SlotMigrating, StoreError
from ..keys import Keyspace, shard_of
from ..redis_errors import ask_to_unknown_node, translate

logger = logging.getLogger("delay_broker.store")

RedisFailure = (redis.RedisError, RedisClusterException)
"""What redis-py raises: a server's refusal, a connection lost, a Cluster that cannot route."""
ClusterFailure = (*RedisFailure, AttributeError)
"""The same, and the ``AttributeError`` redis-py raises on an ``ASK`` to a master it does not know yet (see
:func:`~delay_broker.redis_errors.ask_to_unknown_node`); any other ``AttributeError`` is raised again as it is."""


class Shards:
    """The shards of one namespace: which ones there are, where a message lives, and how to talk to Redis.

    The shard count is read from the namespace (``requested``, when given, is recorded there the first time
    and checked against it after), so every process of an application sees the same shards.
    """

    def __init__(self, client: AnyRedis, keys: Keyspace, requested: int | None) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self.keys = keys
        """The keys of shard 0 (all of them when the namespace is not sharded)."""
        self._requested = requested
        self._spaces: list[Keyspace] | None = None
        self._lock = threading.Lock()
        self._master: tuple[str, int] | None = None
        self._wake_tokens: dict[bytes, int] = {}
        self._recorded = False
        self._unrecordable = False
        self._looked_at = float("-inf")
        self._clock_offset: tuple[float, int] | None = None

    # -- errors ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def calling(self, doing: str) -> Iterator[None]:
        """Redis errors as delay_broker's (see :mod:`delay_broker.redis_errors`)."""
        try:
            yield
        except RedisFailure as error:
            raise self.translated(error, doing) from error
        except AttributeError as error:
            if not ask_to_unknown_node(error):
                raise
            raise SlotMigrating(
                f"Redis Cluster refused {doing}: its slot is migrating to a master added since this client read the "
                "slot map (redis-py cannot follow ASK there); nothing was done, doing it again is safe"
            ) from error

    def translated(self, error: redis.RedisError | RedisClusterException, doing: str) -> DelayBrokerError:
        """``error`` as delay_broker's, a failover noticed on the way."""
        translated = translate(error, doing)
        if not isinstance(error, MasterNotFoundError):  # no Sentinel named one: asking again only waits
            self._notice_failover()
        return translated

    def _notice_failover(self) -> None:
        """Log once when a Sentinel-managed master has moved (redis-py follows it by itself)."""
        try:
            address = master_address(self.client)
        except RedisFailure:
            return
        if address is None or address == self._master:
            return
        if self._master is not None:
            logger.warning(
                "Store %r: the Redis master moved from %s:%s to %s:%s (Sentinel failover); following it.",
                self.keys.namespace,
                *self._master,
                *address,
            )
        self._master = address

    # -- the layout ------------------------------------------------------------------------------------

    @property
    def spaces(self) -> list[Keyspace]:
        """The key sets of every shard, shard 0 first (read from the namespace on first use, and again at most
        once a second while it has no count recorded: a dashboard or exporter started before the application
        would otherwise see shard 0 only, for ever)."""
        if self._spaces is not None and not self._recorded:
            now = time.monotonic()
            if now - self._looked_at >= 1.0:
                self._looked_at = now
                with contextlib.suppress(DelayBrokerError):  # Redis away: the next call will say so
                    self.refresh()
        return self._spaces or self._read("reading the shard layout")

    def layout(self, doing: str) -> list[Keyspace]:
        """:attr:`spaces` without the look for a newly recorded count (every script call asks)."""
        return self._spaces or self._read(doing)

    def space(self, shard: int, doing: str) -> Keyspace:
        return (self._spaces or self._read(doing))[shard]

    def _read(self, doing: str) -> list[Keyspace]:
        if self._spaces is None:
            with self._lock:
                if self._spaces is None:
                    self._use(self._resolve(doing))
                    with contextlib.suppress(redis.RedisError):
                        self._master = master_address(self.client)
        assert self._spaces is not None
        return self._spaces

    def _use(self, count: int) -> None:
        self._spaces = Keyspace.shards_of(self.keys.namespace, self.keys.prefix, count)
        self._wake_tokens = {space.wake.encode(): n for n, space in enumerate(self._spaces)}

    def refresh(self) -> None:
        """Read the shard count again while the namespace has none recorded (promoters call it every
        ``max_idle``): a store that took the default of one shard then serves the shards a later process
        recorded. A recorded count never changes, so this costs nothing once there is one."""
        if self._recorded or self._spaces is None:
            return
        with self._lock:
            count = self._resolve("reading the shard layout")
            if count != len(self._spaces):
                logger.info("Store %r: the namespace now has %d shards.", self.keys.namespace, count)
                self._use(count)

    def settle_for_parking(self) -> None:
        """Before the first park of a store given no shard count: record one shard, unless a count is recorded
        by then (which it takes). A process given another count later is refused, instead of parking a second
        copy of an id in a shard this one never looks in (and this one parking into shard 0 for ever)."""
        if self._settled():
            return
        self._read("park")
        with self._lock:
            if self._settled():  # by another thread meanwhile
                return
            try:
                count = self._resolve("recording the shard layout", record=1)
            except DelayBrokerError as error:
                if not isinstance(error.__cause__, redis.exceptions.NoPermissionError):
                    raise
                # An ACL written before this was recorded here (without +set): park as before, and say so.
                self._unrecordable = True
                logger.warning("Store %r: cannot record its shard count (%s); allow +set.", self.keys.namespace, error)
                return
            if count != len(self.spaces):
                self._use(count)

    def _settled(self) -> bool:
        return self._recorded or self._unrecordable

    def _resolve(self, doing: str, *, record: int | None = None) -> int:
        wanted = self._requested
        recording = wanted if wanted is not None else record
        with self.calling(doing):
            recorded = self.client.get(self.keys.layout)
            if recorded is None and recording is not None:
                # Recorded even when it is 1: a later process given another number is refused, not obeyed.
                self.client.set(self.keys.layout, recording, nx=True)
                recorded = self.client.get(self.keys.layout)
        self._recorded = recorded is not None
        try:
            have = 1 if recorded is None else int(recorded)
        except ValueError:
            raise ConfigurationError(
                f"malformed shard count {recorded!r} in {self.keys.layout}: set it to the number of shards"
            ) from None
        if wanted is not None and wanted != have:
            raise ConfigurationError(
                f"namespace {self.keys.namespace!r} has {have} shard(s) ({self.keys.layout}), this store was "
                f"given shards={wanted}: every process of an application must use the same number (changing it "
                "needs a new namespace)"
            )
        return have

    # -- where messages live ---------------------------------------------------------------------------

    def shard_for(self, id: str) -> int:
        """The shard holding message ``id`` (recurring schedules' occurrences live in shard 0)."""
        return shard_of(id, len(self.spaces))

    def by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for id in ids:
            groups.setdefault(self.shard_for(id), []).append(id)
        return groups

    def to_search(self, id: str) -> list[int]:
        """The shards that may hold ``id``: its own, and shard 0 (where a schedule's occurrences live)."""
        home = self.shard_for(id)
        return [home] if home == 0 else [home, 0]

    # -- the clock -------------------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The Redis server's clock, by which every due time is kept."""
        with self.calling("TIME"):
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def estimated_now_ms(self) -> int:
        """The Redis clock without a round trip: the local clock corrected by an offset read once a minute.
        Close enough to choose a tier or a pack, whose bounds are many seconds away."""
        local = time.time()
        if self._clock_offset is None or local - self._clock_offset[0] > 60:
            self._clock_offset = (local, self.now_ms() - int(local * 1000))
        return int(local * 1000) + self._clock_offset[1]

    # -- waking promoters ------------------------------------------------------------------------------

    def relay_wake(self, shard: int, woke: Any) -> None:
        """Wake a promoter for a shard other than 0: promoters block on shard 0's wake list only (one
        blocking command cannot watch keys of several Cluster slots), so the shard's name is pushed there."""
        if shard == 0 or not int(woke):
            return
        spaces = self.spaces
        try:
            with self.calling("waking a promoter"):
                pipe = self.client.pipeline(transaction=False)
                push_wake(pipe, spaces[0].wake, spaces[shard].wake)
                pipe.execute()
        except StoreError as error:
            # The park (or nack) is done; shard 0 may be on a master that is down. A lost wake costs at most a
            # promoter's max_idle, which each shard is looked at within anyway: never the caller's call.
            logger.debug("Waking a promoter through shard 0 failed: %s", error)

    def woken_shards(self, token: bytes | str) -> frozenset[int]:
        """The shards a token popped from a wake list asks to look at (all of them for a stop or unknown one)."""
        shard = self._wake_tokens.get(token if isinstance(token, bytes) else token.encode())
        return frozenset(range(len(self.spaces))) if shard is None else frozenset((shard,))


def check_client(client: AnyRedis) -> None:
    if client.get_connection_kwargs().get("decode_responses"):
        raise DelayBrokerError("the Redis client must return bytes: create it with decode_responses=False")


def push_wake(pipe: Any, key: str, token: str) -> None:
    """Queue on ``pipe`` what the scripts' ``wake_one`` does: ``token`` once at the head of the wake list ``key``."""
    pipe.lrem(key, 0, token)
    pipe.lpush(key, token)
