"""The delay store: parked messages in Redis and the atomic operations on them.

The store knows ids, due times and envelopes; it knows nothing of Dramatiq or Celery. Every operation is one
Lua script (see ``delay_broker/scripts``) on one shard, so each is atomic, touches one Redis Cluster slot and
costs one round trip. A namespace has one shard unless it was given more (``shards=N``, for Redis Cluster):
a message lives in the shard its id hashes to, recurring schedules and their occurrences in shard 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException
from redis.sentinel import MasterNotFoundError

from . import packing, scripts, tracing
from .clock import MAX_DUE_MS, Delay, delay_to_ms, due_of_score, due_to_ms, score_ceiling, score_floor
from .connect import CLIENT_DEFAULTS, AnyRedis, client_from_url, describe, is_cluster, master_address
from .envelope import VERSION as ENVELOPE_VERSION
from .envelope import Envelope
from .errors import (
    ConfigurationError,
    CorruptEnvelope,
    DelayBrokerError,
    FarTierUnavailable,
    InvalidDelay,
    InvalidMessage,
    NotReplicated,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
)
from .far import FarRow, FarTier, check_storable
from .keys import DEFAULT_NAMESPACE, DEFAULT_PREFIX, MAX_SHARDS, Keyspace, shard_of
from .packing import (
    NOT_PACKABLE,
    NOWHERE,
    SPLIT_AT,
    IndexReshaped,
    IndexShape,
    Location,
    PackedElsewhere,
    binary_id,
    pack_name,
)
from .records import (
    Claim,
    ClaimedMessage,
    DirectPromotion,
    FarSnapshot,
    IndexScan,
    MessageInfo,
    NackAction,
    OnConflict,
    ParkRequest,
    ParkResult,
    Position,
    Requeued,
    ScheduleUpdate,
    State,
    StoredSchedules,
    StoreStats,
    TracedPromotion,
)
from .redis_errors import no_longer_master, translate
from .schedule_defs import is_marker_record
from .targets import ListTarget

logger = logging.getLogger("delay_broker.store")

MAX_BATCH = 1000
MAX_ID_LENGTH = 512
DEFAULT_MAX_PAYLOAD = 1024 * 1024
DEFAULT_PACK_AFTER_MS = 300_000
NEW_INDEX = IndexShape()
"""The packed index's shape until a store sees another: one partition."""
PACK_CALLS = 10
"""Calls a by-id script is given to find the ids where the packed index says they are (see :meth:`_run_by_id`)."""
PACK_OPEN_CHUNK = 100
"""Records one ``open_pack.lua`` call moves at most: about 3.5 ms of Redis time (500 took 18 ms, which every
promotion of the server waited for), some 25,000 records a second per promoter."""
FAR_HOLD_BACK_SECONDS = 5.0
"""How long far rows a shard could not take are passed over by the sweeps of this store (at least a sweep
interval): long enough for the other shards' rows to get through, short enough to find a master back soon."""
STORE_OPTIONS = (
    "namespace",
    "prefix",
    "max_payload_bytes",
    "max_attempts",
    "retry_backoff",
    "shards",
    "replicas",
    "replica_timeout",
    "max_delay",
    "dead_max_count",
    "dead_max_age",
    "record_version",
    "far_tier",
    "far_horizon",
    "pack_after",
)
"""Options of :class:`DelayStore` itself; :meth:`DelayStore.from_url` gives every other one to the client."""

ListState = Literal["due", "inflight", "dead"]

LATENESS_EDGES_MS = (10, 100, 1000, 10000, 60000)
"""Upper edges of the store's promotion-lateness buckets (must equal LATENESS_EDGES in _lib.lua)."""


def new_promoter_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DelayStore:
    """Parked messages of one namespace in one Redis (a server, a Sentinel-managed master, or a Cluster).

    Parameters:
      client: a redis-py client that returns bytes (``decode_responses=False``, the default): ``redis.Redis``
        (also from ``Sentinel.master_for``) or ``redis.cluster.RedisCluster``.
      namespace: separates independent stores in one Redis; every key carries it in its hash tag.
      max_payload_bytes: larger payloads are refused at park time.
      max_attempts: promotion attempts (failed deliveries or lost leases) before a message is dead-lettered.
      retry_backoff: first and largest wait, in seconds, before a failed delivery is tried again.
      shards: how many shards (hash tags, so Redis Cluster slots) the namespace spreads over. ``None`` takes
        what the namespace was created with (1 if never said). A number is recorded in the namespace the
        first time and checked against it after: every process of an application sees the same shards.
      replicas: durable writes. With N > 0, every write (park, reschedule, cancel, ack, nack, promotion)
        waits until N replicas confirm it (Redis ``WAIT``) and raises :class:`~.errors.NotReplicated`
        otherwise, so a write reported done survives a failover. Promotions also need N in-sync replicas
        before they start.
      replica_timeout: seconds to wait for that confirmation.
      max_delay: seconds (or a timedelta): a park or reschedule due further than this from now (by the Redis
        clock) is refused with :class:`~.errors.InvalidDelay` naming the limit. ``None`` (default): no limit
        but the year 2248. Recurring schedules' occurrences are exempt (their period sets their delay).
      dead_max_count: keep at most this many dead letters per shard; the oldest are dropped. ``None``: no bound.
      dead_max_age: seconds (or a timedelta): drop dead letters dead for longer. ``None``: no bound.
        Both bounds are enforced by :meth:`trim_dead`, which promoters call (see there); dropped letters
        are counted in the ``dead_dropped`` counter of :meth:`stats`.
      record_version: the envelope format written (see :mod:`delay_broker.envelope`): 2, the compact binary
        header (default), or 1, the JSON header of releases before it, for a rolling upgrade while older
        promoters still run. Both are always read.
      far_tier: a :class:`~delay_broker.far.FarTier` (or its PostgreSQL URL) to keep messages due beyond its
        horizon out of Redis until they come within it (see :mod:`delay_broker.far`). ``None`` (default):
        every message is parked in Redis.
      far_horizon: the horizon when ``far_tier`` is given as a URL (default 6 hours); sweeps then run every 5 s,
        or four times per horizon if that is shorter.
      pack_after: seconds (or a timedelta): a message due at least this far ahead is packed, at about half the
        memory (see :mod:`delay_broker.packing`), and moved into the ordinary layout by promoters when it comes
        within half of it. Default 5 minutes; ``None`` packs nothing (for a rolling upgrade from a release
        without packs: its promoters would not open them). Packed messages are read, cancelled and rescheduled
        by every store whatever its own setting.
    """

    HISTOGRAM_EDGES = (60_000, 3_600_000, 86_400_000)
    """Stats buckets: due within a minute, an hour, a day; the last bucket counts everything later."""

    def __init__(
        self,
        client: AnyRedis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        prefix: str = DEFAULT_PREFIX,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        max_attempts: int = 5,
        retry_backoff: tuple[float, float] = (1.0, 300.0),
        shards: int | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        max_delay: Delay | None = None,
        dead_max_count: int | None = None,
        dead_max_age: Delay | None = None,
        record_version: int = ENVELOPE_VERSION,
        far_tier: FarTier | str | None = None,
        far_horizon: Delay | None = None,
        pack_after: Delay | None = DEFAULT_PACK_AFTER_MS / 1000,
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise DelayBrokerError("the Redis client must return bytes: create it with decode_responses=False")
        if max_payload_bytes <= 0 or max_attempts < 1:
            raise ValueError("max_payload_bytes and max_attempts must be positive")
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)):
            raise ConfigurationError(f"shards must be a whole number, got {shards!r}")
        if shards is not None and not 1 <= shards <= MAX_SHARDS:
            raise ConfigurationError(f"shards must be 1..{MAX_SHARDS}, got {shards}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(f"replicas must be a whole number >= 0, got {replicas!r}")
        if not replica_timeout > 0:
            raise ConfigurationError(f"replica_timeout must be positive, got {replica_timeout!r}")
        if dead_max_count is not None and (
            isinstance(dead_max_count, bool) or not isinstance(dead_max_count, int) or dead_max_count < 0
        ):
            raise ConfigurationError(f"dead_max_count must be a whole number >= 0 or None, got {dead_max_count!r}")
        if record_version not in (1, 2):
            raise ConfigurationError(f"record_version must be 1 or 2, got {record_version!r}")
        self.record_version = record_version
        self.pack_after_ms = _positive_ms("pack_after", pack_after)
        if self.pack_after_ms is not None and self.pack_after_ms < 10_000:
            raise ConfigurationError(f"pack_after must be at least 10 seconds (or None), got {pack_after!r}")
        self.max_delay_ms = _positive_ms("max_delay", max_delay)
        self.dead_max_count = dead_max_count
        self.dead_max_age_ms = _positive_ms("dead_max_age", dead_max_age)
        self.client = client
        self.cluster = is_cluster(client)
        self.keys = Keyspace(namespace, prefix)
        """The keys of shard 0 (all of them when the namespace is not sharded)."""
        self.max_payload_bytes = max_payload_bytes
        self.max_attempts = max_attempts
        self.retry_backoff_ms = (delay_to_ms(retry_backoff[0]), delay_to_ms(retry_backoff[1]))
        self.replicas = replicas
        self.replica_timeout_ms = delay_to_ms(replica_timeout)
        self._requested_shards = shards
        self._shards: list[Keyspace] | None = None
        self._layout_lock = threading.Lock()
        self._master: tuple[str, int] | None = None
        self._wake_tokens: dict[bytes, int] = {}
        self._layout_recorded = False
        self._layout_unrecordable = False
        self._warned_replication_unknown = False
        self._far_held_back: dict[str, float] = {}
        self._far_shards_down: dict[int, float] = {}
        """Shards whose master lately failed to take far rows, with the end of their pause (monotonic)."""
        self._replica_counts: dict[int, tuple[float, int]] = {}
        self._layout_looked_at = float("-inf")
        self._scripts = {name: client.register_script(scripts.source(name)) for name in scripts.NAMES}
        if isinstance(far_tier, str):
            far_tier = FarTier(far_tier) if far_horizon is None else FarTier.with_horizon(far_tier, far_horizon)
        self.far_tier = far_tier
        self._far = None if far_tier is None else far_tier.table_for(f"{prefix}:{namespace}")
        self._clock_offset: tuple[float, int] | None = None
        self._index_shapes: dict[int, IndexShape] = {}
        """Per shard, the shape of the packed index as last seen (scripts refuse a stale one that matters)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DelayStore:
        """A store on a new client for ``url``: ``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://host:26379,.../mymaster/0`` or ``redis+cluster://host:port,...`` (see
        :mod:`delay_broker.connect`).

        Options this class takes (``namespace``, ``shards``, ``replicas``, ...) configure the store; every
        other one goes to the client (``ssl_ca_certs``, ``username``, ``socket_timeout``, ...).
        """
        client_options = {key: options.pop(key) for key in list(options) if key not in STORE_OPTIONS}
        return cls(client_from_url(url, **client_options), **options)

    def __repr__(self) -> str:
        return f"<DelayStore {self.keys.namespace!r} on {describe(self.client)}>"

    # -- plumbing ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _redis(self, doing: str) -> Iterator[None]:
        """Redis errors as delay_broker's (see :mod:`delay_broker.redis_errors`)."""
        try:
            yield
        except (redis.RedisError, RedisClusterException) as error:
            raise self._translated(error, doing) from error

    def _translated(self, error: redis.RedisError | RedisClusterException, doing: str) -> DelayBrokerError:
        """``error`` as delay_broker's, a failover noticed on the way."""
        translated = translate(error, doing)
        if not isinstance(error, MasterNotFoundError):  # no Sentinel named one: asking again only waits
            self._notice_failover()
        return translated

    def _notice_failover(self) -> None:
        """Log once when a Sentinel-managed master has moved (redis-py follows it by itself)."""
        try:
            address = master_address(self.client)
        except (redis.RedisError, RedisClusterException):
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

    @property
    def shards(self) -> list[Keyspace]:
        """The key sets of every shard, shard 0 first (read from the namespace on first use, and again at most
        once a second while it has no count recorded: a dashboard or exporter started before the application
        would otherwise see shard 0 only, for ever)."""
        if self._shards is not None and not self._layout_recorded:
            now = time.monotonic()
            if now - self._layout_looked_at >= 1.0:
                self._layout_looked_at = now
                with contextlib.suppress(DelayBrokerError):  # Redis away: the next call will say so
                    self.refresh_layout()
        return self._shards or self._read_layout("reading the shard layout")

    def _read_layout(self, doing: str) -> list[Keyspace]:
        if self._shards is None:
            with self._layout_lock:
                if self._shards is None:
                    self._use_layout(self._resolve_layout(doing))
                    with contextlib.suppress(redis.RedisError):
                        self._master = master_address(self.client)
        assert self._shards is not None
        return self._shards

    def _use_layout(self, count: int) -> None:
        self._shards = Keyspace.shards_of(self.keys.namespace, self.keys.prefix, count)
        self._wake_tokens = {space.wake.encode(): n for n, space in enumerate(self._shards)}

    def refresh_layout(self) -> None:
        """Read the shard count again while the namespace has none recorded (promoters call it every
        ``max_idle``): a store that took the default of one shard then serves the shards a later process
        recorded. A recorded count never changes, so this costs nothing once there is one."""
        if self._layout_recorded or self._shards is None:
            return
        with self._layout_lock:
            count = self._resolve_layout("reading the shard layout")
            if count != len(self._shards):
                logger.info("Store %r: the namespace now has %d shards.", self.keys.namespace, count)
                self._use_layout(count)

    def _layout_for_parking(self) -> None:
        """Before the first park of a store given no shard count: record one shard, unless a count is recorded
        by then (which it takes). A process given another count later is refused, instead of parking a second
        copy of an id in a shard this one never looks in (and this one parking into shard 0 for ever)."""
        if self._layout_settled():
            return
        self._read_layout("park")
        with self._layout_lock:
            if self._layout_settled():  # by another thread meanwhile
                return
            try:
                count = self._resolve_layout("recording the shard layout", record=1)
            except DelayBrokerError as error:
                if not isinstance(error.__cause__, redis.exceptions.NoPermissionError):
                    raise
                # An ACL written before this was recorded here (without +set): park as before, and say so.
                self._layout_unrecordable = True
                logger.warning("Store %r: cannot record its shard count (%s); allow +set.", self.keys.namespace, error)
                return
            if count != len(self.shards):
                self._use_layout(count)

    def _layout_settled(self) -> bool:
        return self._layout_recorded or self._layout_unrecordable

    def _resolve_layout(self, doing: str, *, record: int | None = None) -> int:
        wanted = self._requested_shards
        recording = wanted if wanted is not None else record
        with self._redis(doing):
            recorded = self.client.get(self.keys.layout)
            if recorded is None and recording is not None:
                # Recorded even when it is 1: a later process given another number is refused, not obeyed.
                self.client.set(self.keys.layout, recording, nx=True)
                recorded = self.client.get(self.keys.layout)
        self._layout_recorded = recorded is not None
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

    def shard_for(self, id: str) -> int:
        """The shard holding message ``id`` (recurring schedules' occurrences live in shard 0)."""
        return shard_of(id, len(self.shards))

    def _run(
        self,
        name: str,
        shard: int,
        args: Sequence[Any],
        *,
        extra: Sequence[str] = (),
        write: bool = True,
        replicas: int | None = None,
    ) -> Any:
        """Script ``name`` on a shard; a write waits for ``replicas`` (by default the store's) to confirm it."""
        space = (self._shards or self._read_layout(name))[shard]
        keys = [*space.keys_of(scripts.keys_used(name)), *extra]
        replicas = self.replicas if replicas is None else replicas
        try:  # as _redis() does, without a context manager's cost on every call
            if write and replicas:
                return self._run_replicated(name, space, keys, args, replicas)
            return self._evalsha(name, keys, args)
        except (redis.RedisError, RedisClusterException) as error:
            elsewhere = packing.packed_elsewhere(error) if isinstance(error, redis.ResponseError) else None
            if elsewhere is not None:
                raise elsewhere from None
            raise self._translated(error, name) from error

    def _run_by_id(
        self,
        name: str,
        shard: int,
        ids: Sequence[str],
        args: Sequence[Any],
        *,
        targets: Sequence[str] | None = None,
        write: bool = True,
        replicas: int | None = None,
    ) -> Any:
        """Script ``name`` on ``ids`` of a shard, told where each is packed (see ``pack_locate`` in _lib.lua).

        It is first told that none is; a script that finds ids packed elsewhere writes nothing and says where
        they are, and is called again with that (a pack opened, or an id parked again, in between moves them
        again); one given an index partition that a split moved an id out of says the index's shape, and is
        called again with the partitions of that. ``targets``: per id, the pack a park may append it to (the
        shard's ``packs`` key for none)."""
        space = (self._shards or self._read_layout(name))[shard]
        binaries = [binary_id(id) for id in ids]
        binaries_arg = b"".join(binaries)
        where: list[Location | None] = [None] * len(ids)
        for _ in range(PACK_CALLS):
            shape = self._index_shapes.get(shard, NEW_INDEX)
            extra: list[str] = []
            for n, binary in enumerate(binaries):
                location = where[n]
                extra.append(space.packed(shape.partition(binary)) if binary != NOT_PACKABLE else space.packs)
                extra.append(space.packs if location is None else space.pack(location.pack))
                if targets is not None:
                    extra.append(targets[n])
            locations = " ".join(NOWHERE if location is None else str(location) for location in where)
            arguments = [*args, str(shape), binaries_arg, locations]
            try:
                return self._run(name, shard, arguments, extra=extra, write=write, replicas=replicas)
            except PackedElsewhere as elsewhere:
                for position, location in elsewhere.locations.items():
                    where[position - 1] = location
            except IndexReshaped as reshaped:
                self._index_shapes[shard] = reshaped.shape
        raise StoreUnavailable(
            f"{name}: the messages kept moving between packs and the ordinary layout over {PACK_CALLS} calls; "
            "doing it again is safe"
        )

    def _split_index(self, shard: int, partition: int, size: int = SPLIT_AT + 1) -> None:
        """Split partitions of the shard's packed index, the next ones in line, up to ``partition``, which a park
        filled past :data:`~.packing.SPLIT_AT` (to ``size`` entries: a batch that filled one several times over
        doubles the index as many times). Best effort: the park is done, and a later one asks again."""
        space = self.shards[shard]
        try:
            shape = self._index_shapes.get(shard, NEW_INDEX)
            wanted = shape.splits_to(partition) + (size // SPLIT_AT - 1) * shape.partitions
            while wanted > 0:
                pairs, _ = shape.splits(min(wanted, MAX_BATCH // 2))
                keys = [space.packed(number) for pair in pairs for number in pair]
                done, reply = self._run("split_index", shard, [str(shape), len(pairs)], extra=keys)
                shape = self._index_shapes[shard] = IndexShape.parse(_text(reply))
                if not int(done):  # another process split meanwhile: a park asks again if need be
                    return
                wanted -= len(pairs)
        except DelayBrokerError as error:
            logger.debug("Store %r: splitting the packed index failed: %s", self.keys.namespace, error)

    def _evalsha(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Script ``name`` by its hash, sent whole (and so loaded) where the server lacks it. Not through redis-py's
        ``Script``: on a Cluster its fallback loads the script on every primary, which fails while any one is
        down and so held up the healthy shards; and its call adds client time to every park (an import and copies
        of the arguments each time)."""
        sha = self._scripts[name].sha
        try:
            return self.client.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            if self.cluster:  # sent whole, it is loaded on the node of its keys only
                return self.client.eval(scripts.source(name), len(keys), *keys, *args)
            self.client.script_load(scripts.source(name))  # not EVAL: the least ACL allows only EVALSHA
            return self.client.evalsha(sha, len(keys), *keys, *args)

    def _shard_client(self, space: Keyspace) -> redis.Redis:
        """A client of the one server holding a shard: ``WAIT`` must follow the write on its connection."""
        if not self.cluster:
            return self.client  # type: ignore[return-value]
        node = self.client.get_node_from_key(space.due)  # type: ignore[union-attr]
        return self.client.get_redis_connection(node)  # type: ignore[union-attr]

    def _on_shard_master(self, space: Keyspace, call: Callable[[redis.Redis], Any]) -> Any:
        """``call`` with a client of the shard's master. On a Cluster whose slot moved (failover, resharding)
        the slot map is read again and the call made once more: the per-node client cannot follow ``MOVED``."""
        try:
            return call(self._shard_client(space))
        except (redis.exceptions.AskError, redis.ConnectionError, redis.TimeoutError) as error:
            if not self.cluster:
                raise
            self.client.nodes_manager.initialize()  # type: ignore[union-attr]
            return call(self._moved_to(error) or self._shard_client(space))
        except redis.ResponseError as error:
            # The node the slot map named is a replica now (a clean CLUSTER FAILOVER leaves it up): nothing
            # redirects a WAIT, so the map is read again here. The write before the WAIT may have been made:
            # the caller gets an outage to back off from, not the same write made twice.
            if self.cluster and no_longer_master(error):
                self.client.nodes_manager.initialize()  # type: ignore[union-attr]
            raise

    def _moved_to(self, error: Exception) -> redis.Redis | None:
        """A client of the node a ``MOVED`` reply names. Right after a reshard the node asked for the slot map
        may not know of the move yet, and the map it gives sends the call back to the slot's old owner."""
        if not isinstance(error, redis.exceptions.MovedError):
            return None  # an ASK target serves only calls preceded by ASKING: the slot map's owner is asked
        node = self.client.get_node(host=error.host, port=error.port)  # type: ignore[union-attr]
        return None if node is None else self.client.get_redis_connection(node)  # type: ignore[union-attr]

    def _run_replicated(
        self, name: str, space: Keyspace, keys: list[str], args: Sequence[Any], replicas: int | None = None
    ) -> Any:
        def write(pipe: Any) -> object:
            return self._scripts[name](keys=keys, args=args, client=pipe)

        return self._replicated(name, space, write, replicas)

    def _replicated(
        self, name: str, space: Keyspace, write: Callable[[Any], object], replicas: int | None = None
    ) -> Any:
        """``write`` (into a pipeline) followed by ``WAIT`` for ``replicas`` (by default the store's) on the same
        connection to the shard's master."""
        needed = self.replicas if replicas is None else replicas

        def write_and_wait(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            write(pipe)
            pipe.wait(needed, self.replica_timeout_ms)
            return pipe.execute()

        reply, confirmed = self._on_shard_master(space, write_and_wait)
        if int(confirmed) < needed:
            raise NotReplicated(
                f"{name} was written on the master but confirmed by {confirmed} of {needed} replica(s) "
                f"within {self.replica_timeout_ms} ms: not reported as done (a failover now could lose it); "
                "doing it again is safe"
            )
        return reply

    def _require_replicas(self, shard: int, doing: str) -> None:
        """Refuse to start ``doing`` on a master that has fewer in-sync replicas than ``replicas``."""
        if not self.replicas:
            return
        with self._redis(doing):
            confirmed = int(
                self._on_shard_master(
                    self.shards[shard], lambda client: client.wait(self.replicas, self.replica_timeout_ms)
                )
            )
        if confirmed < self.replicas:
            raise NotReplicated(
                f"not {doing}: the master has {confirmed} of {self.replicas} in-sync replica(s) (a failover may be "
                "under way); backing off"
            )

    def _relay_wake(self, shard: int, woke: Any) -> None:
        """Wake a promoter for a shard other than 0: promoters block on shard 0's wake list only (one
        blocking command cannot watch keys of several Cluster slots), so the shard's name is pushed there."""
        if shard == 0 or not int(woke):
            return
        home, token = self.shards[0].wake, self.shards[shard].wake
        try:
            with self._redis("waking a promoter"):
                pipe = self.client.pipeline(transaction=False)
                _push_wake(pipe, home, token)
                pipe.execute()
        except StoreError as error:
            # The park (or nack) is done; shard 0 may be on a master that is down. A lost wake costs at most a
            # promoter's max_idle, which each shard is looked at within anyway: never the caller's call.
            logger.debug("Waking a promoter through shard 0 failed: %s", error)

    def _by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for id in ids:
            groups.setdefault(self.shard_for(id), []).append(id)
        return groups

    # -- producers -------------------------------------------------------------------------------------

    def park(
        self,
        id: str,
        envelope: Envelope,
        *,
        delay: Delay | None = None,
        due: datetime | None = None,
        on_conflict: OnConflict = "replace",
    ) -> ParkResult:
        """Park one message until ``delay`` from now (Redis clock) or until ``due``.

        ``on_conflict="replace"`` (debounce) gives an id that is already stored the new payload and due time;
        ``"keep"`` (dedup) leaves the stored one alone and reports it as kept.
        """
        if on_conflict == "replace" and self._far is None:
            parked = self._park_one(id, envelope, delay, due)
            if parked is not None:
                return parked
        return self.park_many([ParkRequest(id, envelope, delay=delay, due=due)], on_conflict=on_conflict)[0]

    def _park_one(self, id: str, envelope: Envelope, delay: Delay | None, due: datetime | None) -> ParkResult | None:
        """A park of one id the store does not hold, untraced (every adapter's delayed send: Dramatiq's delay, Celery's
        eta), in one call of ``pack_one.lua`` or ``park_one.lua``: a third of park.lua's server time. None when the
        script leaves the message to park.lua (the id is held, or anything unusual; nothing was written)."""
        if tracing.active():
            return None
        check_id(id)
        kind, value = _due_argument(delay, due, id)
        when = value if kind == "d" else f"@{value}"
        encoded = self._encode_envelope(id, envelope, traced=False)
        self._layout_for_parking()
        shards = self._shards or self._read_layout("park")
        shard = 0 if len(shards) == 1 else shard_of(id, len(shards))
        space = shards[shard]
        binary = binary_id(id)
        shape = self._index_shapes.get(shard, NEW_INDEX)
        partition = space.packs if binary == NOT_PACKABLE else space.packed(shape.partition(binary))
        name, pack_after = None, self.pack_after_ms
        if binary != NOT_PACKABLE and pack_after is not None:
            # The pack is chosen by the estimated Redis clock; the script reads the clock itself for the due time.
            now = self.estimated_now_ms()
            due_ms = now + value if kind == "d" else value
            name = pack_name(due_ms, now, pack_after) if due_ms - now >= pack_after else None
        try:
            if name is not None:
                args = [id, when, encoded, binary, str(shape), name, pack_after, MAX_DUE_MS, self._max_delay_arg()]
                reply = self._run("pack_one", shard, args, extra=[partition, space.pack(name)])
                if reply:
                    self._relay_wake(shard, reply[2])
                    if int(reply[1]):
                        self._split_index(shard, shape.partition(binary))
            else:
                args = [id, when, encoded, binary, str(shape), MAX_DUE_MS, self._max_delay_arg()]
                reply = self._run("park_one", shard, args, extra=[partition])
                if reply:
                    self._relay_wake(shard, reply[1])
        except StoreUnavailable:
            raise
        except DelayBrokerError:  # a refusal: park.lua, which wrote nothing either, says what it is
            return None
        return ParkResult(id, int(reply[0]), "new") if reply else None

    def park_many(self, requests: Iterable[ParkRequest], *, on_conflict: OnConflict = "replace") -> list[ParkResult]:
        """Park many messages: one round trip per 1000 (per shard), each chunk all or nothing.

        Every request is validated before anything is written.
        """
        if on_conflict not in ("replace", "keep"):
            raise ValueError(f"on_conflict must be 'replace' or 'keep', got {on_conflict!r}")
        requests = list(requests)
        routes = {request.envelope.route for request in requests if isinstance(request, ParkRequest)}
        with tracing.park_span(len(requests), next(iter(routes)) if len(routes) == 1 else None):
            encoded = [self._encode_request(request) for request in requests]
            self._layout_for_parking()  # once the requests are found valid: a refused park writes nothing
            if self._far is None:
                return self._park_encoded(encoded, on_conflict)
            return self._park_tiered(requests, encoded, on_conflict)

    def _park_encoded(self, encoded: list[tuple[str, str, int, bytes]], on_conflict: OnConflict) -> list[ParkResult]:
        if len(self._shards or self._read_layout("park")) == 1:
            results: list[ParkResult] = []
            for start in range(0, len(encoded), MAX_BATCH):
                results.extend(self._park(0, encoded[start : start + MAX_BATCH], on_conflict))
            return results
        by_position: dict[int, ParkResult] = {}
        groups: dict[int, list[int]] = {}
        for position, item in enumerate(encoded):
            groups.setdefault(self.shard_for(item[0]), []).append(position)
        for shard, positions in groups.items():
            for start in range(0, len(positions), MAX_BATCH):
                chunk = positions[start : start + MAX_BATCH]
                parked = self._park(shard, [encoded[p] for p in chunk], on_conflict)
                by_position.update(zip(chunk, parked, strict=True))
        return [by_position[position] for position in range(len(encoded))]

    def park_occurrence(
        self, schedule: str, id: str, envelope: Envelope, due: datetime, *, revision: int | None = None
    ) -> ParkResult:
        """Park one occurrence of the recurring schedule ``schedule``, due at ``due``.

        It is parked only if it is due later than every occurrence ever parked for that schedule, so any
        number of schedulers may offer it, before or after it was promoted, and it runs once. Otherwise the
        result is ``kept``, with the due time of the latest occurrence parked for the schedule. With
        ``revision`` (of :meth:`stored_schedules`), the result is ``stale`` and nothing is parked when the
        runtime schedules changed since. Occurrences live in shard 0, beside their schedule's record.
        """
        if not isinstance(schedule, str) or not schedule:
            raise ValueError(f"schedule must be a non-empty string, got {schedule!r}")
        # No max_delay: an occurrence is parked a period ahead (a month for a monthly schedule), which the
        # application chose when it declared the schedule; the limit guards individual sends.
        request = self._encode_request(ParkRequest(id, envelope, due=due))
        expected = "" if revision is None else str(revision)
        return self._park(0, [request], "keep", schedule, max_delay_ms=-1, revision=expected)[0]

    def _park(
        self,
        shard: int,
        chunk: list[tuple[str, str, int, bytes]],
        on_conflict: OnConflict,
        schedule: str = "",
        *,
        max_delay_ms: int | None = None,
        revision: str = "",
        adopt: tuple[int, list[int]] | None = None,
        retire: Sequence[int] = (),
        replicas: int | None = None,
    ) -> list[ParkResult]:
        """One park.lua call: ``adopt`` (the mover's deadline and the rows' tokens) moves far rows in;
        ``retire`` are the tokens of far rows the park replaces (see park.lua)."""
        limit = self._max_delay_arg() if max_delay_ms is None else max_delay_ms
        fence, tokens = (
            ("", " ".join(map(str, retire))) if adopt is None else (str(adopt[0]), " ".join(map(str, adopt[1])))
        )
        pack_after = -1 if self.pack_after_ms is None else self.pack_after_ms
        args: list[Any] = [on_conflict, MAX_DUE_MS, schedule, limit, revision, fence, tokens, pack_after]
        for item in chunk:
            args.extend(item)
        ids = [item[0] for item in chunk]
        reply = self._run_by_id("park", shard, ids, args, targets=self._pack_targets(shard, chunk), replicas=replicas)
        self._relay_wake(shard, reply[-3])
        if int(reply[-2]) >= 0:
            self._split_index(shard, int(reply[-2]), int(reply[-1]))
        outcomes: tuple[Literal["kept", "new", "replaced", "stale", "moved"], ...] = (
            "kept",
            "new",
            "replaced",
            "stale",
            "moved",
        )
        return [ParkResult(item[0], int(reply[2 * n]), outcomes[int(reply[2 * n + 1])]) for n, item in enumerate(chunk)]

    def _pack_targets(self, shard: int, chunk: list[tuple[str, str, int, bytes]]) -> list[str]:
        """Per message, the pack it is appended to when it is due at least ``pack_after`` ahead (by the Redis
        clock as estimated here: park.lua decides by its own), else the shard's ``packs`` key (none)."""
        space = self.shards[shard]
        if self.pack_after_ms is None:
            return [space.packs] * len(chunk)
        now = self.estimated_now_ms()
        targets = []
        for id, kind, value, _ in chunk:
            due = value if kind == "a" else now + value
            packable = due - now >= self.pack_after_ms and binary_id(id) != NOT_PACKABLE
            targets.append(space.pack(pack_name(due, now, self.pack_after_ms)) if packable else space.packs)
        return targets

    def _encode_request(self, request: ParkRequest) -> tuple[str, str, int, bytes]:
        check_id(request.id)
        kind, value = _due_argument(request.delay, request.due, request.id)
        return request.id, kind, value, self._encode_envelope(request.id, request.envelope)

    def _encode_envelope(
        self, id: str, envelope: Envelope, *, keep_context: bool = False, traced: bool = True
    ) -> bytes:
        """``traced=False``: the caller knows there is no trace context to store."""
        if not isinstance(envelope.payload, bytes):
            raise InvalidMessage(f"payload must be bytes, got {type(envelope.payload).__name__}")
        if len(envelope.payload) > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload of {id!r} is {len(envelope.payload)} bytes, over the limit of {self.max_payload_bytes}"
            )
        if traced:
            extra = tracing.with_context(envelope.extra, keep=keep_context)
            if extra != envelope.extra:
                envelope = dataclasses.replace(envelope, extra=extra)
        version = min(self.record_version, envelope.version) if envelope.version else self.record_version
        return envelope.encode(int(time.time() * 1000), version)

    def withdraw(self, id: str, payload: bytes) -> bool:
        """After a park of ``payload`` under ``id`` raised :class:`StoreUnavailable` (:class:`NotReplicated`,
        or a call sent that got no answer), before the message is sent some other way: take back a copy the
        store may hold (a failover may lose it, or it may run: either way not beside the other copy). False when
        that copy is already being promoted, and so runs from the store. True otherwise, also when the copy
        being promoted is another message of the same id (a retry reuses its message's id, and the run it
        retries may still be in flight), and when Redis cannot be asked: nothing more can be done."""
        try:
            try:
                if self.cancel(id):
                    return True
                info = self.get(id)
            except FarTierUnavailable:
                # A row cannot be taken back while PostgreSQL is away (nothing more can be done there), but the
                # copy in Redis can, and must be: a park whose rows were not deleted wrote one.
                if self._cancel_in_redis([id])[0]:
                    return True
                info = self._get_in_redis(id)
            return info is None or info.envelope is None or info.envelope.payload != payload
        except NotReplicated:
            return True  # removed on the master, unconfirmed like the park it takes back
        except DelayBrokerError:
            return True  # the master is gone, and the copy it did not replicate with it

    def cancel(self, id: str) -> bool:
        """Remove a parked (or dead-lettered) message. False if it is unknown, gone or being promoted."""
        return self.cancel_many([id]) == 1

    def cancel_many(self, ids: Sequence[str]) -> int:
        return sum(self.cancel_each(ids))

    def cancel_each(self, ids: Sequence[str]) -> list[bool]:
        """Cancel each id (as :meth:`cancel`), one script call per 1,000 per shard; True for each one removed
        (for an id given twice, its first place)."""
        ids = [check_id(id) for id in ids]
        unique = list(dict.fromkeys(ids))
        if self._far is None:
            removed = {id: bool(flag) for id, flag in zip(unique, self._cancel_in_redis(unique), strict=True)}
        else:
            removed = {}
            for chunk in _chunks(unique):
                removed.update(self._cancel_tiered(chunk))
        first = {id: n for n, id in reversed(list(enumerate(ids)))}
        return [removed[id] and first[id] == n for n, id in enumerate(ids)]

    def _cancel_tiered(self, ids: list[str]) -> dict[str, bool]:
        """Cancel in both tiers, under the ids' locks: a park of the same id moving it between the tiers (in
        neither until it commits) is waited for, not met half-way and missed."""
        assert self._far is not None
        with self._far.parking(ids) as rows:
            # The far tier first: deleting a row waits for a mover that holds it, after which the message is in
            # Redis. Redis is asked for every id, because a mover that died may have left a copy there too.
            deleted = rows.delete(ids)
            in_redis = self._cancel_in_redis(ids)
        # A retired row (see _retired) is no message: its copy in Redis is it, and may have run already.
        far = deleted.keys() - self._retired_rows(deleted)
        self._count("cancelled", [id for id, gone in zip(ids, in_redis, strict=True) if id in far and not gone])
        return {id: id in far or bool(gone) for id, gone in zip(ids, in_redis, strict=True)}

    def _cancel_in_redis(self, ids: list[str], *, replacing: bool = False) -> list[int]:
        """Remove the parked or dead copies of ``ids`` from Redis; ``replacing`` (by a far row) also those a
        promoter holds, as a park in Redis would replace them. Per id: 2 = removed while parked, 1 = removed
        while dead or in flight, 0 = not held."""
        mode = "replace" if replacing else "cancel"
        removed: dict[str, int] = {}
        for shard, group in self._by_shard(ids).items():
            missed: list[str] = []
            for chunk in _chunks(group):
                reply = self._run_by_id("cancel", shard, chunk, [mode, *chunk])
                for id, flag in zip(chunk, reply, strict=True):
                    removed[id] = int(flag)
                    if not int(flag):
                        missed.append(id)
            if shard != 0 and missed:  # a schedule's occurrence lives in shard 0
                for chunk in _chunks(missed):
                    for id, flag in zip(chunk, self._run_by_id("cancel", 0, chunk, [mode, *chunk]), strict=True):
                        removed[id] = int(flag)
        return [removed[id] for id in ids]

    def reschedule(
        self,
        id: str,
        *,
        delay: Delay | None = None,
        due: datetime | None = None,
        envelope: Envelope | None = None,
        expected: MessageInfo | None = None,
    ) -> int | None:
        """Move a parked message to a new due time (``delay=0``: due now). Returns the new due time in ms,
        or None if the id is not parked (unknown, already promoted, in flight or dead).

        ``envelope`` replaces the stored one in the same atomic step (for payloads that carry their own
        due time, such as a Celery message's ``eta`` header). ``expected``, the message as :meth:`get` read
        it: it is moved only if it is still that one, else None. An envelope rewritten from what was read must
        not land on a message parked again under the same id meanwhile (a Celery retry keeps its task id).
        """
        check_id(id)
        kind, value = _due_argument(delay, due, id)
        if expected is not None and (expected.payload_omitted or not expected.raw):
            raise ValueError("expected must be a message read whole by get(), with its envelope")
        read = b"" if expected is None else expected.raw or b""
        # The promote span continues the trace the message was parked in, not the one rescheduling it.
        encoded = b"" if envelope is None else self._encode_envelope(id, envelope, keep_context=True)
        limit = self._max_delay_arg()
        far_due = None if self._far is None else self._reschedule_far(id, kind, value, encoded, envelope, read)
        if far_due is not None:
            # A row was rescheduled; a copy a dead mover left in Redis is rescheduled with it (see _reschedule_far).
            kind, value, limit = "a", far_due, -1
        pack_after = -1 if self.pack_after_ms is None else self.pack_after_ms
        for shard in self._shards_to_search(id):
            moved, woke, over = self._run_by_id(
                "reschedule",
                shard,
                [id],
                [id, kind, value, MAX_DUE_MS, encoded, limit, read, pack_after],
                targets=self._pack_targets(shard, [(id, kind, value, b"")]),
            )
            if int(over) >= 0:
                self._split_index(shard, int(over))
            if int(moved) >= 0:
                self._relay_wake(shard, woke)
                if far_due is None:
                    return int(moved)
                break
        tier = self.far_tier
        if far_due is not None and tier is not None and far_due - self.estimated_now_ms() <= tier.horizon_ms:
            self.sweep_far(ids=[id])  # now within the horizon: into Redis at once
        return far_due

    def _max_delay_arg(self) -> int:
        """``max_delay`` as park.lua and reschedule.lua take it: milliseconds, or -1 for none."""
        return -1 if self.max_delay_ms is None else self.max_delay_ms

    def _shards_to_search(self, id: str) -> list[int]:
        home = self.shard_for(id)
        return [home] if home == 0 else [home, 0]

    def now_ms(self) -> int:
        """The Redis server's clock, by which every due time is kept."""
        with self._redis("TIME"):
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def record_routes(self, routes: Iterable[str]) -> None:
        """Remember routes producers parked for, so promoters in other processes may deliver to them.

        Adapters whose queues are not all declared up front (a Celery producer may route anywhere) record
        each route when they park; promoters allow declared routes plus these.
        """
        names = [route for route in routes if isinstance(route, str) and route]
        if names:
            with self._redis("recording routes"):
                if self.replicas:
                    self._replicated("recording routes", self.keys, lambda pipe: pipe.sadd(self.keys.routes, *names))
                else:
                    self.client.sadd(self.keys.routes, *names)

    def recorded_routes(self) -> set[str]:
        with self._redis("reading routes"):
            members = self.client.smembers(self.keys.routes)
        return {_text(member) for member in members}

    def schedules(self) -> dict[str, int | None]:
        """Recurring schedules that parked an occurrence: name -> due time (ms) of the latest one (None when
        the record is malformed). Not the markers kept beside them (run-now, rewound)."""
        with self._redis("reading schedules"):
            records = self.client.hgetall(self.keys.cron)
        return {
            _text(name): _int_or_none(value) for name, value in records.items() if not is_marker_record(_text(name))
        }

    def forget_schedule(self, name: str) -> bool:
        """Drop the record of a recurring schedule (its occurrences already parked stay parked). The schedules'
        revision moves on and a promoter is woken, so that schedulers read the records again at once: else
        they would go on from the record they hold for up to a minute."""
        with self._redis("forgetting a schedule"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hdel(self.keys.cron, name)
            pipe.incr(self.keys.schedules_rev)
            _push_wake(pipe, self.keys.wake, self.keys.wake)  # the token the scripts' wake_one pushes
            return bool(pipe.execute()[0])

    def stored_schedules(self) -> StoredSchedules:
        """The runtime schedules' definitions and every schedule's record, read in one round trip.

        The revision is read first: definitions changed in between carry a newer revision than the one
        returned, so a reader that acts on the revision reads them again rather than acting on old ones.
        """
        with self._redis("reading schedules"):
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.keys.schedules_rev)
            pipe.hgetall(self.keys.schedules)
            pipe.hgetall(self.keys.cron)
            revision, definitions, records = pipe.execute()
        return StoredSchedules(
            int(revision or 0),
            {_text(name): bytes(value) for name, value in definitions.items()},
            {_text(name): _int_or_none(value) for name, value in records.items()},
        )

    def schedules_revision(self) -> int:
        """The revision of the runtime schedules' definitions (0 before the first change)."""
        with self._redis("reading schedules"):
            return int(self.client.get(self.keys.schedules_rev) or 0)

    def update_schedule(
        self,
        name: str,
        definition: bytes | None,
        *,
        revision: int | None,
        record: int | None,
        record_action: Literal["keep", "rewind", "drop"] = "keep",
        cancel: str | None = None,
        drop_also: str | None = None,
        marker: str | None = None,
    ) -> ScheduleUpdate:
        """Store (or with None delete) a runtime schedule's definition, if the definitions are still at
        ``revision`` and the schedule's record still ``record`` (as read); see ``schedule_update.lua``.

        ``cancel``: the id of the schedule's latest occurrence, cancelled if it is parked and not yet due.
        ``marker``: the record that keeps when the record was last rewound (deleted with it by ``drop``).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"schedule must be a non-empty string, got {name!r}")
        args = [
            name,
            b"" if definition is None else definition,
            "" if revision is None else revision,
            "" if record is None else record,
            record_action,
            cancel or "",
            drop_also or "",
            marker or "",
        ]
        done, current, now_ms, cancelled = self._run_by_id("schedule_update", 0, [cancel] if cancel else [], args)
        return ScheduleUpdate(bool(int(done)), int(current), int(now_ms), bool(int(cancelled)))

    # -- the far tier ----------------------------------------------------------------------------------

    def estimated_now_ms(self) -> int:
        """The Redis clock without a round trip: the local clock corrected by an offset read once a minute.
        Close enough to choose a tier, whose horizon is many seconds away."""
        local = time.time()
        if self._clock_offset is None or local - self._clock_offset[0] > 60:
            self._clock_offset = (local, self.now_ms() - int(local * 1000))
        return int(local * 1000) + self._clock_offset[1]

    def _far_due(self, id: str, kind: str, value: int, now: int) -> int | None:
        """The due time (ms) of a message that belongs in the far tier, or None if it belongs in Redis."""
        assert self.far_tier is not None
        due = value if kind == "a" else now + value
        if due - now <= self.far_tier.horizon_ms:
            return None
        if due > MAX_DUE_MS:
            raise InvalidDelay(f"due time of {id} is past the latest supported")
        if self.max_delay_ms is not None and due - now > self.max_delay_ms:
            raise InvalidDelay(
                f"due time of {id} is {_seconds_text(due - now)} from now, beyond max_delay "
                f"({_seconds_text(self.max_delay_ms)})"
            )
        return due

    def _park_tiered(
        self, requests: list[ParkRequest], encoded: list[tuple[str, str, int, bytes]], on_conflict: OnConflict
    ) -> list[ParkResult]:
        """Park the far messages as rows and the others in Redis, one copy per id across both tiers.

        Each chunk (up to 1,000 ids of one shard and one tier) holds its ids' locks in PostgreSQL around its
        one Redis script: parks of the same id by other processes wait for it and then see it. An id given twice
        is parked twice, in the order given, as in Redis."""
        assert self._far is not None
        now = self.estimated_now_ms()
        dues = [self._far_due(id, kind, value, now) for id, kind, value, _ in encoded]  # validated before writing
        for request, due in zip(requests, dues, strict=True):
            if due is not None:
                check_storable(request.id, request.envelope.route, request.envelope.name or "")
        results: list[ParkResult | None] = [None] * len(encoded)
        for positions in _rounds([item[0] for item in encoded]):
            for chunk in self._shard_chunks([n for n in positions if dues[n] is None], encoded):
                self._park_near(chunk, encoded, on_conflict, results)
            for chunk in self._shard_chunks([n for n in positions if dues[n] is not None], encoded):
                self._park_far(chunk, requests, encoded, dues, on_conflict, results)
        return results  # type: ignore[return-value]

    def _shard_chunks(self, positions: list[int], encoded: list[tuple[str, str, int, bytes]]) -> Iterator[list[int]]:
        groups: dict[int, list[int]] = {}
        for n in positions:
            groups.setdefault(self.shard_for(encoded[n][0]), []).append(n)
        for group in groups.values():
            yield from _chunks(group)

    def _park_near(
        self,
        chunk: list[int],
        encoded: list[tuple[str, str, int, bytes]],
        on_conflict: OnConflict,
        results: list[ParkResult | None],
    ) -> None:
        """Park in Redis (``chunk``: up to 1,000 ids of one shard), replacing (or keeping) a row of the same id."""
        assert self._far is not None
        shard = self.shard_for(encoded[chunk[0]][0])
        parked: list[ParkResult] | None = None
        replaced: dict[str, int] = {}
        with self._far.parking([encoded[n][0] for n in chunk]) as rows:
            if on_conflict == "keep":
                found = rows.due_times([encoded[n][0] for n in chunk])
                retired = self._retired(shard, {id: token for id, (_, token) in found.items()})
                held = {id: due for id, (due, _) in found.items() if id not in retired}
                for n in chunk:
                    if encoded[n][0] in held:
                        results[n] = ParkResult(encoded[n][0], held[encoded[n][0]], "kept")
                chunk = [n for n in chunk if results[n] is None]
                parked = self._park(shard, [encoded[n] for n in chunk], on_conflict) if chunk else []
            else:
                # Deleted in a transaction committed only once the park in Redis is done: a park that fails
                # leaves the rows as they were. The park records the rows' tokens as moved in: if the commit
                # then fails, the rows it leaves are never moved into Redis beside the new copy.
                try:
                    with rows.deleted([encoded[n][0] for n in chunk]) as replaced:
                        parked = self._park(
                            shard, [encoded[n] for n in chunk], on_conflict, retire=list(replaced.values())
                        )
                except FarTierUnavailable as error:
                    if parked is None:
                        raise
                    # Parked all the same, and so reported: the rows left are retired (their tokens recorded),
                    # and raising would have the caller send the message some other way, to run twice.
                    logger.warning("Parked in Redis; the far rows it replaces are left, retired: %s", error)
                else:
                    if replaced:
                        self._forget_tokens(shard, list(replaced.values()))
        assert parked is not None
        # park.lua counted as parked what was new to Redis; the ones that replace a row were parked already.
        renewed = [result.id for result in parked if result.id in replaced and result.outcome == "new"]
        self._count("parked", renewed, sign=-1)
        self._count("replaced", renewed)
        for n, result in zip(chunk, parked, strict=True):
            results[n] = dataclasses.replace(result, outcome="replaced") if result.id in replaced else result

    def _park_far(
        self,
        chunk: list[int],
        requests: list[ParkRequest],
        encoded: list[tuple[str, str, int, bytes]],
        dues: list[int | None],
        on_conflict: OnConflict,
        results: list[ParkResult | None],
    ) -> None:
        """Park as rows, replacing (or keeping) a copy of the same id in Redis."""
        assert self._far is not None
        ids = [encoded[n][0] for n in chunk]
        rows_to_write = [
            (encoded[n][0], dues[n], requests[n].envelope.route, requests[n].envelope.name or "", encoded[n][3])
            for n in chunk
        ]
        # A park that raises has written nothing, in either tier: its caller may hand the message elsewhere (a
        # Dramatiq retry goes to the broker), and a row left behind would run it a second time.
        unsure: StoreUnavailable | None = None
        with self._far.parking(ids) as rows, rows.atomic():
            if on_conflict == "keep":
                # A retired row is no message to keep: its id is free (see _retired).
                found = rows.due_times(ids)
                retired = self._retired(self.shard_for(ids[0]), {id: token for id, (_, token) in found.items()})
                if retired:
                    rows.delete(list(retired))
            previous = rows.insert(rows_to_write, replace=on_conflict == "replace")  # type: ignore[arg-type]
            if on_conflict == "keep":
                # Looked up after the insert, which waited for any sweeper moving a row of these ids: a copy it
                # moved into Redis is seen here, and the row just written for its id is taken back. A read:
                # if it fails, nothing changed in Redis, and the rows are rolled back.
                in_redis = self._held_in_redis([id for id in ids if id not in previous])
                if in_redis:
                    rows.delete(list(in_redis))
                cancelled: dict[str, int] = {}
            else:  # a copy of the same id in Redis, even one a promoter holds, is replaced by the row
                in_redis = {}
                self._held_in_redis(ids)  # Redis answers, before anything is written there
                try:
                    gone = self._cancel_in_redis(ids, replacing=True)
                except StoreUnavailable as error:
                    # Sent, but no answer: a copy in Redis may be gone already, so the rows stay (never none).
                    unsure, gone = error, []
                cancelled = {id: was for id, was in zip(ids, gone, strict=False) if was}
        if unsure is not None:
            raise unsure
        parked: list[str] = []
        renewed: list[str] = []
        for n in chunk:
            id = encoded[n][0]
            if id in in_redis:
                results[n] = ParkResult(id, in_redis[id], "kept")
            elif on_conflict == "keep" and id in previous:
                results[n] = ParkResult(id, previous[id], "kept")
            else:
                replaced = id in previous or id in cancelled
                results[n] = ParkResult(id, dues[n] or -1, "replaced" if replaced else "new")
                # A message still parked (a row, or a copy parked in Redis) is counted as replaced, as park.lua
                # counts it; one that was in flight or dead came back, and is counted as parked.
                (renewed if id in previous or cancelled.get(id) == 2 else parked).append(id)
        self._count("parked", parked)
        self._count("replaced", renewed)

    def _count(self, field: str, ids: list[str], *, sign: int = 1) -> None:
        """Add what the far tier did to the store's counters (each id in its shard's), as the scripts count what
        they do in Redis; ``sign=-1`` takes back what a script counted. Best effort: the rows are written, a
        counter that misses one is only a figure."""
        for shard, group in self._by_shard(ids).items():
            try:
                with self._redis(f"counting {field}"):
                    self.client.hincrby(self.shards[shard].stats, field, sign * len(group))
            except DelayBrokerError as error:
                logger.warning(
                    "Store %r: counting %d %s message(s) failed: %s", self.keys.namespace, len(group), field, error
                )

    def _held_in_redis(self, ids: list[str]) -> dict[str, int]:
        """The ids of ``ids`` that Redis holds, with their due time (-1 in flight or dead), as park.lua tells
        held ids apart: one ``held.lua`` call per 1,000 per shard (and shard 0, where occurrences live)."""
        held: dict[str, int] = {}
        for group in self._by_shard(ids).values():
            for number in self._shards_to_search(group[0]):
                for chunk in _chunks([id for id in group if id not in held]):
                    for id, due in zip(chunk, self._run_by_id("held", number, chunk, chunk, write=False), strict=True):
                        if int(due) != -2:
                            held[id] = int(due)
        return held

    def _reschedule_far(
        self, id: str, kind: str, value: int, encoded: bytes, envelope: Envelope | None, expected: bytes
    ) -> int | None:
        """Give ``id``'s far row its new due time (ms, returned); None if it has no row, or a retired one (see
        :meth:`_retired`: the copy in Redis, if any, is the message), or one whose record is not ``expected``
        (when given). The row keeps its token, so a copy a mover that dies meanwhile leaves in Redis (rescheduled
        too, by the caller) still stops a second move."""
        assert self._far is not None
        if self._live_far_row(id) is None:
            return None
        now = self.estimated_now_ms()
        due = value if kind == "a" else now + value
        self._far_due(id, "a", due, now)  # the same limits as a park
        route, name = (envelope.route, envelope.name or "") if envelope is not None else ("", "")
        return due if self._far.reschedule(id, due, encoded or None, route, name, expected or None) else None

    def sweep_far(self, *, ids: Sequence[str] = ()) -> int:
        """Move the far rows now due within the horizon (or those of ``ids``) into Redis: one transaction of at
        most the tier's ``batch`` rows. Returns how many rows left the table. Promoters call this; any number of
        processes may at once."""
        if self._far is None or self.far_tier is None:
            return 0
        tier = self.far_tier
        now = self.now_ms()
        deadline = now + tier.lease_ms
        rows = self._far.move(
            now + tier.horizon_ms,
            tier.batch,
            tier.lease_ms,
            lambda found: self._adopt(found, deadline, partial=True),
            ids,
            skip=self._held_back_rows(),
        )
        if rows:
            self._forget_moved(rows)
        return len(rows)

    def _held_back_rows(self) -> list[str]:
        """The ids of rows whose shard could not take them lately: passed over until their pause ends, or they
        would fill every batch, and a master that is down would hold up the other shards' messages too."""
        now = time.monotonic()
        self._far_held_back = {id: until for id, until in self._far_held_back.items() if until > now}
        return list(self._far_held_back)

    def _rows_by_shard(self, rows: list[FarRow]) -> dict[int, list[FarRow]]:
        by_id = {row.id: row for row in rows}  # ids are unique in a namespace's table
        return {shard: [by_id[id] for id in ids] for shard, ids in self._by_shard(by_id).items()}

    def _adopt(self, rows: list[FarRow], deadline_ms: int, *, partial: bool = False) -> list[FarRow]:
        """Park far rows into their shards; returns the rows adopted. With ``partial``, a shard whose master
        cannot take them now (down, hung, or no replica confirming) is left out, its rows left in the table and
        held back for a while, so that the other shards' rows move; it raises only when no shard took its rows.
        A shard that failed lately is not tried again until its pause ends, and shards are not begun past half
        the lease: a hung master costs socket timeouts, which must not run the whole batch out of its lease."""
        adopted: list[FarRow] = []
        failed: list[tuple[int, list[FarRow], StoreUnavailable | None]] = []
        started, budget = time.monotonic(), (self.far_tier.lease_ms if self.far_tier else 0) / 2000
        groups = sorted(self._rows_by_shard(rows).items(), key=lambda item: item[0] in self._far_shards_down)
        for shard, group in groups:
            if partial and (self._far_shards_down.get(shard, 0.0) > time.monotonic()):
                failed.append((shard, group, None))  # paused: held back again, untried
                continue
            if partial and time.monotonic() - started > budget:
                break  # not tried: taken first by the next sweep
            chunk = [(row.id, "a", row.due_ms, row.record) for row in group]
            tokens = [row.token for row in group]
            try:
                replicas = self._adoption_replicas(shard)
                self._park(shard, chunk, "keep", max_delay_ms=-1, adopt=(deadline_ms, tokens), replicas=replicas)
            except StoreUnavailable as error:
                if not partial:
                    raise
                failed.append((shard, group, error))
                continue
            adopted.extend(group)
            if self._far_shards_down.pop(shard, None) is not None:
                logger.info("Store %r: far rows move into shard %d again.", self.keys.namespace, shard)
        pause = time.monotonic() + max(FAR_HOLD_BACK_SECONDS, self.far_tier.sweep_interval if self.far_tier else 0)
        for shard, group, refusal in failed:
            self._far_held_back.update((row.id, pause) for row in group)
            if refusal is None:
                continue
            if shard not in self._far_shards_down:
                logger.warning(
                    "Store %r: far rows for shard %d stay in PostgreSQL until it takes them (%s); the other shards' "
                    "move on.",
                    self.keys.namespace,
                    shard,
                    refusal,
                )
            self._far_shards_down[shard] = pause
        refusals = [refusal for _, _, refusal in failed if refusal is not None]
        if refusals and not adopted:
            raise refusals[0]  # nothing moved: the sweeper backs off, and passes over these rows next time
        return adopted

    def _adoption_replicas(self, shard: int) -> int:
        """Replicas that must confirm far rows moved into ``shard`` before the rows are deleted: the store's, or
        with none asked for, one if the shard's master has any (looked up at most once a second). Those messages
        were safe in PostgreSQL, often for weeks: a failover right after the move must not lose them, as it may
        lose a fresh park (which its producer saw only just acknowledged). Unconfirmed, the move is rolled back
        and made again later."""
        if self.replicas:
            return self.replicas
        known = self._replica_counts.get(shard)
        if known is not None and known[0] > time.monotonic():
            return known[1]

        def look(client: redis.Redis) -> int:
            pipe = client.pipeline(transaction=False)
            pipe.wait(0, 0)  # answers at once; refused under an ACL without +wait, which the move would need
            pipe.info("replication")
            return 1 if int(pipe.execute()[1].get("connected_slaves", 0)) > 0 else 0

        try:
            with self._redis("reading the replication state"):
                replicas = int(self._on_shard_master(self.shards[shard], look))
        except DelayBrokerError as error:
            # No permission, or a server or proxy without WAIT or INFO: moves go on unconfirmed, as before.
            cause = error.__cause__
            unknown = isinstance(cause, redis.exceptions.ResponseError) and "unknown command" in str(cause).lower()
            if not (isinstance(cause, redis.exceptions.NoPermissionError) or unknown):
                raise
            if not self._warned_replication_unknown:
                self._warned_replication_unknown = True
                logger.warning(
                    "Store %r: cannot read the master's replication state or wait for it (%s); far rows moved into "
                    "Redis are not confirmed by a replica before they are deleted. Allow +info and +wait, or set "
                    "replicas=1.",
                    self.keys.namespace,
                    error,
                )
            replicas = 0
        self._replica_counts[shard] = (time.monotonic() + 1.0, replicas)
        return replicas

    def _forget_moved(self, rows: list[FarRow]) -> None:
        for shard, group in self._rows_by_shard(rows).items():
            self._forget_tokens(shard, [row.token for row in group])

    def _forget_tokens(self, shard: int, tokens: list[int]) -> None:
        """Drop the tokens of rows now deleted. A failure here only leaves tokens for :meth:`forget_moved_orphans`."""
        try:
            with self._redis("forgetting moved tokens"):
                self.client.zrem(self.shards[shard].moved, *tokens)
        except StoreError as error:
            logger.debug("Tokens of moved rows left for later: %s", error)

    def forget_moved_orphans(self, older_than: float = 300.0) -> int:
        """Delete the rows of tokens recorded more than ``older_than`` seconds ago, then drop the tokens.

        Such a row is dead weight: its message was moved in by a mover that died before deleting it, or replaced
        by a park in Redis whose delete did not commit (PostgreSQL gone in between). The token kept it from
        running a second time; left until its due time, weeks away maybe, it would also be found by a ``keep``
        park of its id, which would keep it and write nothing. A row parked again since has a new token."""
        if self._far is None:
            return 0
        dropped = 0
        edge = self.now_ms() - delay_to_ms(older_than)
        for space in self.shards:
            with self._redis("reading moved tokens"):
                found: list[bytes] = self.client.zrangebyscore(space.moved, "-inf", edge, 0, MAX_BATCH)  # type: ignore[assignment]
                tokens = [int(token) for token in found]
            if not tokens:
                continue
            if not self._far.delete_tokens(tokens):  # rows first: a token dropped while its row lives lets it move
                continue
            with self._redis("forgetting moved tokens"):
                dropped += int(self.client.zrem(space.moved, *tokens))
        return dropped

    def _far_view(self) -> contextlib.AbstractContextManager[Any]:
        """The table as it was before Redis is read, for reads of both tiers that see each message once.

        A message being moved is in the table until the move commits, and in Redis, its token in ``moved``,
        from before then until after. So when the table is read as of a snapshot taken first, then Redis with
        the tokens in ``moved``, and the rows of those tokens are left out, no message is missed, and none is
        seen twice unless a sweeper's commit and its dropping of the tokens both land between the snapshot and
        the read of Redis (stats, which read the tokens with the counts), or a move lands between reading the
        tokens and the pages (a listing, which keeps one copy)."""
        assert self._far is not None
        return self._far.snapshot()

    @contextlib.contextmanager
    def far_snapshot(self) -> Iterator[FarSnapshot | None]:
        """A read of both tiers that sees each message once (None without a tier): open it before reading
        Redis, and give it to every :meth:`scan_far` of the read. See :meth:`_far_view`."""
        if self._far is None:
            yield None
            return
        with self._far_view() as view:
            yield FarSnapshot(view, tuple(self._moved_tokens()))

    def _moved_tokens(self) -> list[int]:
        """The tokens of far rows moved into Redis whose delete may not be committed yet (see :mod:`.far`)."""
        tokens: list[int] = []
        for space in self.shards:
            with self._redis("reading moved tokens"):
                tokens.extend(int(token) for token in self.client.zrange(space.moved, 0, -1))  # type: ignore[arg-type]
        return tokens

    def _far_info(self, row: FarRow) -> MessageInfo:
        return MessageInfo(
            id=row.id, state="due", due_ms=row.due_ms, at_ms=None, raw=row.record, attempts=0, error=None
        )

    # -- inspection ------------------------------------------------------------------------------------

    def get(self, id: str) -> MessageInfo | None:
        check_id(id)
        if self._far is not None:
            # The row first: a message moved in meanwhile is in Redis before its row is deleted. A row whose token
            # is recorded as moved in is such a one, or one a park in Redis replaced: the copy in Redis is it.
            row = self._live_far_row(id)
            if row is not None:
                return self._far_info(row)
        return self._get_in_redis(id)

    def _live_far_row(self, id: str) -> FarRow | None:
        """``id``'s far row, unless it has none or a retired one (see :meth:`_retired`)."""
        assert self._far is not None
        row = self._far.get(id)
        return None if row is None or self._retired(self.shard_for(id), {id: row.token}) else row

    def _retired_rows(self, tokens: Mapping[str, int]) -> set[str]:
        """:meth:`_retired` for ids of any shards."""
        return set().union(
            *(self._retired(shard, {id: tokens[id] for id in group}) for shard, group in self._by_shard(tokens).items())
        )

    def _retired(self, shard: int, tokens: Mapping[str, int]) -> set[str]:
        """The ids among ``tokens`` (id: its row's token) whose rows are retired: their tokens are recorded in
        ``moved``, so the rows never run. A mover adopted them and died before deleting them, or a park in Redis
        replaced them and its delete did not commit. Their messages are in Redis, or ran already: the ids are
        free."""
        if not tokens:
            return set()
        ids = list(tokens)
        with self._redis("reading moved tokens"):
            scores = self.client.zmscore(self.shards[shard].moved, [str(tokens[id]) for id in ids])
        return {id for id, score in zip(ids, scores, strict=True) if score is not None}

    def _get_in_redis(self, id: str) -> MessageInfo | None:
        for shard in self._shards_to_search(id):
            state, due, at, raw, attempts, error = self._run_by_id("get", shard, [id], [id], write=False)
            state = state.decode()
            if state == "gone" and not raw:
                continue
            return MessageInfo(
                id=id,
                state=state,
                due_ms=None if int(due) < 0 else int(due),
                at_ms=None if int(at) < 0 else int(at),
                raw=raw or None,
                attempts=int(attempts),
                error=_text(error) if error else None,
            )
        return None

    def list_messages(
        self,
        state: ListState = "due",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
        offset: int = 0,
        count: int = 100,
        headers_only: bool = False,
    ) -> list[MessageInfo]:
        """A page of messages in one state, oldest first: parked by due time, in flight by lease deadline,
        dead by when they were dead-lettered. ``start_ms``/``end_ms`` bound that time (inclusive).
        ``headers_only``: the envelopes without their payload (``payload_omitted``), all a listing shows; a
        page of large messages then costs Redis little in its reply.

        On a sharded namespace the page is merged from every shard: the scores and ids of each one's first
        ``offset + count`` entries, then the page's own messages.
        """
        if not 0 < count <= MAX_BATCH or offset < 0:
            raise ValueError(f"count must be 1..{MAX_BATCH} and offset >= 0")
        if state not in ("due", "inflight", "dead"):
            raise ValueError(f"state must be 'due', 'inflight' or 'dead', got {state!r}")
        if state == "due":
            low = "-inf" if start_ms is None else score_floor(start_ms)
            high = "+inf" if end_ms is None else score_ceiling(end_ms)
        else:
            low = "-inf" if start_ms is None else start_ms
            high = "+inf" if end_ms is None else end_ms
        far = self._far is not None and state == "due"
        if len(self.shards) == 1 and state != "due":
            return [info for _, info in self._list_page(0, state, low, high, offset, count, headers_only)]
        wanted = offset + count
        with self._far_view() if far else contextlib.nullcontext() as view:
            leaving = self._moved_tokens() if far else []
            # Packs first: promoters move messages from packs into the index only, so a pack opened meanwhile
            # shows its messages twice (the index's copy wins below) rather than not at all. At the start of
            # their pack's slot (see scan_packs), in the pack's order.
            packed_pages: list[list[tuple[float, str, tuple[int, int] | MessageInfo]]] = [
                [
                    (float(score_floor(int(at[0]))), info.id, info)
                    for at, info in self.scan_packs(
                        shard,
                        start_ms=start_ms,
                        end_ms=end_ms,
                        after=None,
                        scan=2**62,
                        limit=wanted,
                        headers_only=headers_only,
                    ).matches
                ]
                for shard in range(len(self.shards) if state == "due" else 0)
            ]
            # Each shard's first `wanted` entries as (score, id) only: the page is chosen from them, and only its
            # own messages are then read whole (an offset of 100,000 read 100,000 payloads per shard).
            pages: list[list[tuple[float, str, tuple[int, int] | MessageInfo]]] = [
                [
                    (score, id, (shard, n))
                    for n, (score, id) in enumerate(self._index_entries(shard, state, low, high, wanted))
                ]
                for shard in range(len(self.shards))
            ]
            if far:
                assert self._far is not None
                rows = self._far.page(start_ms, end_ms, 0, wanted, leaving=leaving, on=view)
                pages.append([(float(score_floor(row.due_ms)), row.id, self._far_info(row)) for row in rows])
            pages.extend(packed_pages)
        merged = heapq.merge(*pages, key=lambda entry: entry[0])
        unique = {id: (score, id, source) for score, id, source in merged}  # a later (Redis) copy wins
        chosen = sorted(unique.values(), key=lambda entry: entry[0])[offset:wanted]
        return self._read_whole(chosen, state, low, high, headers_only)

    def _index_entries(self, shard: int, state: ListState, low: Any, high: Any, wanted: int) -> list[tuple[float, str]]:
        """The first ``wanted`` entries of a shard's index within the window, as (score, id)."""
        space = self.shards[shard]
        key = {"due": space.due, "inflight": space.inflight, "dead": space.dead}[state]
        found: list[tuple[float, str]] = []
        with self._redis("listing messages"):
            while len(found) < wanted:
                size = min(10 * MAX_BATCH, wanted - len(found))
                page: list[tuple[bytes, float]] = self.client.zrangebyscore(  # type: ignore[assignment]
                    key, low, high, start=len(found), num=size, withscores=True
                )
                found.extend((float(score), _text(id)) for id, score in page)
                if len(page) < size:
                    break
        return found

    def _read_whole(
        self,
        chosen: list[tuple[float, str, tuple[int, int] | MessageInfo]],
        state: ListState,
        low: Any,
        high: Any,
        headers_only: bool,
    ) -> list[MessageInfo]:
        """The chosen messages read whole. A shard's share of a page is a run of its index: one list.lua call
        reads it, and its messages are found in it by id; one that moved meanwhile is read by id, and one that
        is gone is left out."""
        runs: dict[int, list[int]] = {}
        for _, _, source in chosen:
            if isinstance(source, tuple):
                runs.setdefault(source[0], []).append(source[1])
        read: dict[str, MessageInfo] = {}
        for shard, positions in runs.items():
            first = min(positions)
            for _, info in self._list_page(shard, state, low, high, first, max(positions) - first + 1, headers_only):
                read[info.id] = info
        page: list[MessageInfo] = []
        for _, id, source in chosen:
            found = source if isinstance(source, MessageInfo) else read.get(id) or self.get(id)
            if found is not None and found.state == state:
                page.append(found)
        return page

    def _list_page(
        self, shard: int, state: ListState, low: Any, high: Any, offset: int, count: int, headers_only: bool = False
    ) -> list[tuple[float, MessageInfo]]:
        reply = self._run("list", shard, [low, high, offset, count, state, "1" if headers_only else ""], write=False)
        return [_listed(state, *reply[n : n + 5], omitted=headers_only) for n in range(0, len(reply), 5)]

    def scan_index(
        self,
        state: ListState,
        shard: int,
        *,
        min_score: str,
        max_score: str,
        after: Position | None,
        scan: int,
        limit: int,
        queue: str | None = None,
        task: str | None = None,
        id_prefix: str | None = None,
        headers_only: bool = False,
    ) -> IndexScan:
        """A bounded scan of one shard's index of ``state`` between two scores, after the position ``after``
        (None: from the start), for messages of ``queue``, ``task`` and ``id_prefix`` (``find.lua``). See
        :mod:`delay_broker.operations`; ``headers_only`` as for :meth:`list_messages`."""
        if state not in ("due", "inflight", "dead"):
            raise ValueError(f"state must be 'due', 'inflight' or 'dead', got {state!r}")
        args = [
            state,
            min_score,
            max_score,
            *(after or ("", "")),
            min(scan, 5000),
            min(limit, MAX_BATCH),
            queue or "",
            task or "",
            id_prefix or "",
            "1" if headers_only else "",
        ]
        reply = self._run("find", shard, args, write=False)
        matches = [
            ((_text(reply[n + 1]), _text(reply[n])), _listed(state, *reply[n : n + 5], omitted=headers_only)[1])
            for n in range(4, len(reply), 5)
        ]
        last = (_text(reply[2]), _text(reply[3])) if reply[2] else None
        return IndexScan(int(reply[0]), bool(int(reply[1])), matches, last)

    def scan_packs(
        self,
        shard: int,
        *,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        limit: int,
        queue: str | None = None,
        task: str | None = None,
        id_prefix: str | None = None,
        headers_only: bool = False,
    ) -> IndexScan:
        """:meth:`scan_index` of a shard's packed messages (``find_packed.lua``): pack after pack in the order of
        their time slots, each pack's messages in the order they were parked, so only roughly by due time (a
        pack spans at most a sixteenth of its messages' distance). A position is a pack's start and
        ``name/position`` of a record in it."""
        space = self.shards[shard]
        ordered = sorted(
            (packing.pack_start(name), name)
            for name, earliest in self._packs(shard)
            if end_ms is None or earliest <= end_ms
        )
        resume: tuple[int, str, int] | None = None
        if after is not None:
            pack, _, record = after[1].rpartition("/")
            resume = (int(after[0]), pack, int(record))
        matches: list[tuple[Position, MessageInfo]] = []
        examined = 0
        last = after
        for start, name in ordered:
            if resume is not None and (start, name) < resume[:2]:
                continue
            position = resume[2] if resume is not None and (start, name) == resume[:2] else -1
            while True:
                if examined >= scan or len(matches) >= limit:
                    return IndexScan(examined, False, matches, last)
                args = [name, position, min(scan - examined, 5000), min(limit - len(matches), MAX_BATCH)]
                args += [queue or "", task or "", id_prefix or "", "1" if headers_only else ""]
                args += ["" if start_ms is None else start_ms, "" if end_ms is None else end_ms]
                reply = self._run("find_packed", shard, args, extra=[space.pack(name)], write=False)
                examined += int(reply[0])
                position = int(reply[2])
                last = (str(start), f"{name}/{position}")
                for n in range(3, len(reply), 6):
                    _, info = _listed("due", *reply[n : n + 5], omitted=headers_only)
                    matches.append(((str(start), f"{name}/{int(reply[n + 5])}"), info))
                if int(reply[1]):
                    break
        return IndexScan(examined, True, matches, last)

    def scan_far(
        self,
        *,
        start_ms: int | None,
        end_ms: int | None,
        after: Position | None,
        scan: int,
        queue: str | None = None,
        task: str | None = None,
        id_prefix: str | None = None,
        snapshot: FarSnapshot | None = None,
    ) -> IndexScan:
        """:meth:`scan_index` of the far tier: rows by due time within ``start_ms``..``end_ms`` of ``queue`` (the
        envelope's route), ``task`` and ``id_prefix``, filtered by PostgreSQL, so every row examined matches.
        Positions are a row's due time and token. Exhausted at once without a tier. With a ``snapshot``
        (:meth:`far_snapshot`, opened before Redis was read) a message moving into Redis meanwhile is seen once."""
        if self._far is None:
            return IndexScan(0, True, [], after)
        count = min(scan, MAX_BATCH)
        after_row = None if after is None else (int(after[0]), int(after[1]))
        rows = self._far.page(
            start_ms,
            end_ms,
            0,
            count,
            after=after_row,
            route=queue,
            name=task,
            id_prefix=id_prefix,
            leaving=() if snapshot is None else snapshot.leaving,
            on=None if snapshot is None else snapshot.view,
        )
        matches = [((str(row.due_ms), str(row.token)), self._far_info(row)) for row in rows]
        return IndexScan(len(rows), len(rows) < count, matches, matches[-1][0] if matches else after)

    def promotion_lateness(self) -> list[tuple[str, int]]:
        """Messages promoted so far, store-wide, by how late (ms after their due time): ``("10", n)`` for under
        10 ms, then 100, 1000, 10000, 60000 and ``"more"`` (counted by the promote and ack scripts)."""
        with self._redis("reading lateness"):
            if self.cluster:  # the shards' keys live in different slots, so on different nodes
                replies = [self.client.hgetall(space.lateness) for space in self.shards]
            else:
                pipe = self.client.pipeline(transaction=False)
                for space in self.shards:
                    pipe.hgetall(space.lateness)
                replies = pipe.execute()
        totals = dict.fromkeys([*map(str, LATENESS_EDGES_MS), "more"], 0)
        for reply in replies:
            for bucket, count in reply.items():
                name = _text(bucket)
                if name in totals:
                    totals[name] += int(count)
        return list(totals.items())

    def iter_all(self, state: ListState = "due", page: int = 500) -> Iterator[MessageInfo]:
        """Every message of a state, page by page, shard after shard (not a snapshot: changes meanwhile may be
        missed; across shards not in time order)."""
        if state == "due":  # packs first: a message moves from a pack into the index, not back
            for shard in range(len(self.shards)):
                after: Position | None = None
                while True:
                    scan = self.scan_packs(
                        shard, start_ms=None, end_ms=None, after=after, scan=5000, limit=page
                    )  # fmt: skip
                    yield from (info for _, info in scan.matches)
                    if scan.exhausted:
                        break
                    after = scan.last
        for shard in range(len(self.shards)):
            offset = 0
            while True:
                infos = self._list_page(shard, state, "-inf", "+inf", offset, page)
                yield from (info for _, info in infos)
                if len(infos) < page:
                    break
                offset += page
        if self._far is not None and state == "due":
            offset = 0
            while rows := self._far.page(None, None, offset, page):
                yield from map(self._far_info, rows)
                offset += len(rows)

    def stats(self, heartbeat_window: float = 30.0) -> StoreStats:
        """Counts over every shard: one script per shard, each a consistent snapshot of its shard."""
        window = delay_to_ms(heartbeat_window)
        far_counts = None
        with self._far_view() if self._far is not None else contextlib.nullcontext() as view:
            snapshots = [
                self._run("stats", shard, [window, *self.HISTOGRAM_EDGES], write=False)
                for shard in range(len(self.shards))
            ]
            if self._far is not None:  # the moved tokens read with each shard's counts: no move lands between
                leaving = [int(token) for reply in snapshots for token in reply[9]]
                far_counts = self._far.counts(int(snapshots[0][0]), self.HISTOGRAM_EDGES, leaving, on=view)
        counters: dict[str, int] = {}
        heads = []
        for reply in snapshots:
            pairs = iter(reply[7])
            for name, value in zip(pairs, pairs, strict=True):
                counters[name.decode()] = counters.get(name.decode(), 0) + int(value)
            if int(reply[5]) >= 0:
                heads.append(int(reply[5]))

        def total(index: int) -> int:
            return sum(int(reply[index]) for reply in snapshots)

        now = int(snapshots[0][0])
        histogram = [sum(int(reply[8][n]) for reply in snapshots) for n in range(len(snapshots[0][8]))]
        far = far_overdue = 0
        if far_counts is not None:
            far, far_overdue, far_head, far_histogram = far_counts
            histogram = [a + b for a, b in zip(histogram, far_histogram, strict=True)]
            heads.extend([] if far_head is None else [far_head])
        return StoreStats(
            now_ms=now,
            parked=total(1) + far,
            inflight=total(2),
            dead=total(3),
            overdue=total(4) + far_overdue,
            next_due_ms=min(heads) if heads else None,
            live_promoters=max(int(reply[6]) for reply in snapshots),
            counters=counters,
            histogram=histogram,
            shards=len(snapshots),
            far=far,
            packed=total(10),
        )

    # -- promoters -------------------------------------------------------------------------------------

    def claim(self, batch: int, lease: float, promoter_id: str, *, shard: int = 0) -> Claim:
        """Lease up to ``batch`` due messages of one shard for ``lease`` seconds (at-least-once promotion).

        Expired leases of other promoters are given back first. Deliver each message, then :meth:`ack` it
        (or :meth:`nack` it) with the claim's ``lease_deadline_ms`` and ``shard`` before the lease runs out.
        """
        # Durable stores check for an in-sync replica first and do not WAIT after: a claim whose WAIT failed would
        # hold messages it never hands over until their lease expires and counts an attempt. A claim lost in a
        # failover only means a redelivery, which at-least-once allows; acks still WAIT.
        self._require_replicas(shard, "claiming")
        reply = self._run(
            "claim", shard, [_batch(batch), delay_to_ms(lease), self.max_attempts, promoter_id], write=False
        )
        messages = []
        dead_end = len(reply) - 2 * int(reply[3])
        for n in range(4, dead_end, 3):
            id, score, raw = reply[n].decode(), float(reply[n + 1]), reply[n + 2]
            try:
                envelope: Envelope | None = Envelope.decode(raw)
                problem = None
            except CorruptEnvelope as error:
                envelope, problem = None, str(error)
            messages.append(ClaimedMessage(id, due_of_score(score), raw, envelope, problem))
        next_wake = int(reply[2])
        dead = [(_stored_id(reply[n]), _text(reply[n + 1])) for n in range(dead_end, len(reply), 2)]
        return Claim(int(reply[0]), int(reply[1]), None if next_wake < 0 else next_wake, messages, shard, dead)

    def ack(self, lease_deadline_ms: int, ids: Sequence[str], *, shard: int = 0) -> int:
        """Forget delivered messages whose lease (identified by its deadline) this promoter still holds."""
        return sum(int(self._run("ack", shard, [lease_deadline_ms, *chunk])) for chunk in _chunks(list(ids)))

    def renew(self, lease_deadline_ms: int, ids: Sequence[str], lease: float, *, shard: int = 0) -> tuple[int, int]:
        """Extend by ``lease`` seconds the lease of ``ids``, still held with ``lease_deadline_ms``, while their
        delivery goes on. Returns the new deadline (the token for :meth:`ack`/:meth:`nack` from now on) and how
        many ids it holds; ids another promoter reclaimed are not among them."""
        if not ids:
            return lease_deadline_ms, 0
        reply = self._run("renew", shard, [lease_deadline_ms, delay_to_ms(lease), *ids])
        return int(reply[0]), int(reply[1])

    def nack(
        self, lease_deadline_ms: int, failures: Sequence[tuple[str, str, NackAction]], *, shard: int = 0
    ) -> list[str]:
        """Give back claimed messages that were not delivered: ``(id, reason, action)`` each.

        ``"retry"`` tries again after an exponential backoff until ``max_attempts``, then dead-letters;
        ``"dead"`` dead-letters at once with the reason; ``"release"`` puts the message back at its due time
        without counting an attempt (the promoter is stopping, or the target broker is down). Returns
        ``"retried"``, ``"dead"``, ``"released"`` or ``"not held"`` per message.
        """
        outcomes: list[str] = []
        for chunk in _chunks(list(failures)):
            args: list[Any] = [lease_deadline_ms, self.max_attempts, *self.retry_backoff_ms]
            for id, reason, action in chunk:
                if action not in ("retry", "dead", "release"):
                    raise ValueError(f"unknown nack action {action!r}")
                # An error's text may hold what UTF-8 cannot (a file name decoded with surrogateescape).
                args.extend((id, reason.encode("utf-8", "backslashreplace").decode(), action))
            reply = self._run("nack", shard, args)
            self._relay_wake(shard, reply[-1])
            outcomes.extend(("not held", "retried", "dead", "released")[int(code)] for code in reply[:-1])
        return outcomes

    def check_direct(self, routes: Mapping[str, ListTarget]) -> None:
        """Refuse exactly-once promotion into ``routes`` when it cannot be one atomic script.

        On a Redis Cluster every target key must sit in the slot of every shard of the namespace (so: one
        shard, and targets whose hash tag is the namespace's). Raises :class:`ConfigurationError` saying so.
        """
        if not self.cluster:
            return
        targets = sorted({key for target in routes.values() for key in (target.list_key, target.hash_key) if key})
        if len(self.shards) > 1 and targets:
            raise ConfigurationError(
                f"exactly-once promotion cannot work on a Redis Cluster with shards={len(self.shards)}: one script "
                "touches one slot, and the shards are in different slots. Use at-least-once promotion (a broker "
                "outside the cluster, or a deliverer of the framework)"
            )
        slot = key_slot(self.keys.due.encode())
        elsewhere = [key for key in targets if key_slot(key.encode()) != slot]
        if elsewhere:
            raise ConfigurationError(
                f"exactly-once promotion cannot work on this Redis Cluster: target key(s) {elsewhere} are not in "
                f"slot {slot} of {self.keys.pattern}, and one script touches one slot. Use at-least-once promotion "
                f"(a broker outside the cluster, or a deliverer of the framework) or give the targets the hash tag "
                f"{{{self.keys.tag}}}"
            )

    @property
    def pack_lead_ms(self) -> int:
        """How long before a pack's earliest due time promoters open it: half of ``pack_after`` (of the default
        when this store packs nothing: others may)."""
        return (self.pack_after_ms or DEFAULT_PACK_AFTER_MS) // 2

    def open_packs(self, shard: int, *, calls: int = 8) -> int | None:
        """Move the shard's packs whose earliest message is due within :attr:`pack_lead_ms` into the ordinary
        layout, at most ``calls`` times :data:`PACK_OPEN_CHUNK` records (promoters call this). Returns when the
        next pack is to be opened (ms, Redis clock; now or earlier when there is more to open already), or None
        when nothing is packed."""
        for _ in range(calls):
            now = self.estimated_now_ms()
            head = self._packs(shard, first_only=True)
            if not head:
                return None
            name, earliest = head[0]
            if earliest - self.pack_lead_ms > now:
                return earliest - self.pack_lead_ms
            self._open_pack(shard, name)
        return now

    def _packs(self, shard: int, *, first_only: bool = False) -> list[tuple[str, int]]:
        """The shard's packs with their earliest due times, earliest first (``first_only``: that one only)."""
        with self._redis("looking at packs"):
            packs: list[tuple[bytes, float]] = self.client.zrange(  # type: ignore[assignment]
                self.shards[shard].packs, 0, 0 if first_only else -1, withscores=True
            )
        return [(_text(name), int(earliest)) for name, earliest in packs]

    def _open_pack(self, shard: int, name: str) -> None:
        """One chunk of pack ``name`` into the ordinary layout: its head's ids read first, then moved by a call
        given their index partitions (refused if another promoter took that head meanwhile)."""
        space = self.shards[shard]
        pack = space.pack(name)
        base, ids = self._run("open_pack", shard, ["peek", name, PACK_OPEN_CHUNK], extra=[pack], write=False)
        binaries = [ids[n : n + 16] for n in range(0, len(ids), 16)]
        for _ in range(PACK_CALLS):
            shape = self._index_shapes.get(shard, NEW_INDEX)
            partitions = [
                space.packed(shape.partition(binary)) if binary != NOT_PACKABLE else space.packs for binary in binaries
            ]
            try:
                reply = self._run(
                    "open_pack", shard, ["open", name, len(binaries), base, ids, str(shape)], extra=[pack, *partitions]
                )
            except IndexReshaped as reshaped:
                self._index_shapes[shard] = reshaped.shape
                continue
            if int(reply[0]) >= 0:
                self._relay_wake(shard, reply[3])
            return

    def promote_direct(
        self, routes: Mapping[str, ListTarget], batch: int, promoter_id: str, *, shard: int = 0
    ) -> DirectPromotion:
        """Move due messages of one shard straight into Redis lists of its server, exactly once
        (``promote_list.lua``).

        Messages whose route is not in ``routes`` are dead-lettered: a stored message can only reach the
        queues the application declared. With no route declared yet, nothing is promoted.
        """
        self.check_direct(routes)
        if not routes:
            return self._idle_look(shard, promoter_id)
        self._require_replicas(shard, "promoting")
        extra: list[str] = []
        args: list[Any] = [_batch(batch), promoter_id]
        for name, target in routes.items():
            extra.extend((target.list_key, target.hash_key or target.list_key))
            args.extend((name, target.mode))
        reply = self._run("promote_list", shard, args, extra=extra)
        next_due = int(reply[1])
        groups_end = 5 + 3 * int(reply[4])
        groups = reply[5:groups_end]
        by_task = {(_text(groups[i]), _text(groups[i + 1])): int(groups[i + 2]) for i in range(0, len(groups), 3)}
        traced_end = groups_end + 1 + 4 * int(reply[groups_end])
        entries = [_text(value) for value in reply[groups_end + 1 : traced_end]]
        return DirectPromotion(
            now_ms=int(reply[0]),
            next_due_ms=None if next_due < 0 else next_due,
            promoted=int(reply[2]),
            dead_lettered=int(reply[3]),
            lateness_ms=[int(value) for value in reply[traced_end:]],
            shard=shard,
            by_task=by_task,
            traced=[TracedPromotion(*entries[i : i + 4]) for i in range(0, len(entries), 4)],
        )

    def _idle_look(self, shard: int, promoter_id: str) -> DirectPromotion:
        """What a promotion with no route would see: nothing moved, the clock, and the shard's head while it is
        still ahead. An overdue head stays overdue until a route is declared, so it is no reason to look again
        at once: the promoter sleeps its ``max_idle`` instead of spinning."""
        snapshot = self._run("stats", shard, [30_000], write=False)
        now, head = int(snapshot[0]), int(snapshot[5])
        return DirectPromotion(now, head if head > now else None, 0, 0, [], shard)

    def wait_for_wake(self, timeout: float, promoter_id: str) -> frozenset[int] | None:
        """Block until a park moves a shard's head earlier, :meth:`wake` is called for this promoter, or timeout.

        Returns the shards to look at again (every shard after :meth:`wake`), or None on timeout. Uses BLPOP
        on shard 0's wake lists, so a sleeping promoter costs Redis nothing.
        """
        shards = self.shards
        timeout = max(timeout, 0.001)
        kwargs = self.client.get_connection_kwargs()
        # redis-py 8 leaves its default socket timeout (5 s) out of the kwargs of a pool made from a URL (such as
        # a Dramatiq RedisBroker's) and keeps it as orig_socket_timeout: a 5 s BLPOP would then time out.
        socket_timeout = kwargs["socket_timeout"] if "socket_timeout" in kwargs else kwargs.get("orig_socket_timeout")
        if socket_timeout:
            # Within the socket timeout with room for the reply, and never a mere millisecond: the promoter
            # blocks again until its wait is over, and a 1 ms BLPOP made that hundreds of calls a second.
            timeout = min(timeout, max(float(socket_timeout) - 1.0, float(socket_timeout) / 2))
        keys = [shards[0].wake_one(promoter_id), shards[0].wake]
        with self._redis(f"BLPOP on the wake lists {keys}"):
            popped = self.client.blpop(keys, timeout=timeout)
        if popped is None:
            return None
        token = popped[1]
        shard = self._wake_tokens.get(token if isinstance(token, bytes) else token.encode())
        return frozenset(range(len(shards))) if shard is None else frozenset((shard,))

    def wake(self, promoter_id: str) -> None:
        """Wake one particular sleeping promoter (used to stop it without waiting out its sleep)."""
        key = self.keys.wake_one(promoter_id)
        with self._redis("waking a promoter"):
            pipe = self.client.pipeline(transaction=False)
            pipe.lpush(key, b"stop")
            pipe.expire(key, 60)
            pipe.execute()

    def eviction_policies(self) -> dict[str, str]:
        """The masters of this store's shards that may evict keys (a ``maxmemory`` and a policy other than
        ``noeviction``), each with its policy: such a server deletes parked messages silently when it fills up.
        Empty when none may, or when the user may not read the settings (no ``+info``)."""
        risky: dict[str, str] = {}
        for shard, space in enumerate(self.shards):
            try:
                reply = self._run("memory_policy", shard, [], write=False)
            except DelayBrokerError:
                continue
            if len(reply) == 2 and int(reply[0]) and _text(reply[1]) != "noeviction":
                kwargs = self._shard_client(space).connection_pool.connection_kwargs  # Sentinel: no address
                server = f"{kwargs['host']}:{kwargs.get('port', 6379)}" if "host" in kwargs else f"of shard {shard}"
                risky[server] = _text(reply[1])
        return risky

    def forget_promoter(self, promoter_id: str) -> None:
        """Remove a stopped promoter's heartbeats and stop marker."""
        try:
            for space in self.shards:
                self.client.zrem(space.promoters, promoter_id)
            self.client.delete(self.keys.wake_one(promoter_id))
        except (redis.RedisError, RedisClusterException, DelayBrokerError):
            pass  # it ages out of the heartbeat window anyway (and a stopping promoter must not raise)

    # -- dead letters ----------------------------------------------------------------------------------

    def requeue_dead(self, ids: Sequence[str] | None = None, *, dead_by_ms: int | None = None) -> Requeued:
        """Park dead-lettered messages again, due now, attempts reset. ``ids=None`` requeues all those
        dead-lettered at or before ``dead_by_ms`` (Redis clock; by default when the call starts): a letter
        that dies again meanwhile stays, instead of being requeued again and again while a cause persists.

        Dead letters with no payload (nothing to requeue) stay; purge them with :meth:`purge_dead`.
        """
        count, left = 0, list[str]()
        if ids is not None:
            for shard, group in self._by_shard(check_id(id) for id in ids).items():
                for chunk in _chunks(group):
                    done, missed = self._requeue(shard, [MAX_BATCH, 0, 0, *chunk])
                    if shard != 0 and missed:
                        again, missed = self._requeue(0, [MAX_BATCH, 0, 0, *missed])
                        done += again
                    count += done
                    left.extend(missed)
            return Requeued(count, left)
        until = self.now_ms() if dead_by_ms is None else dead_by_ms
        for shard in range(len(self.shards)):
            skipped = 0
            while True:
                # Requeued ids leave the dead set; those it cannot requeue stay at its head: page past them.
                reply = self._run("requeue", shard, [MAX_BATCH, skipped, until])
                self._relay_wake(shard, int(reply[0]) > 0)
                if reply == [0]:  # an empty page: nothing dead past the ones left
                    break
                count += int(reply[0])
                skipped += len(reply) - 1
                left.extend(_stored_id(id) for id in reply[1:])
        return Requeued(count, left)

    def _requeue(self, shard: int, args: list[Any]) -> tuple[int, list[str]]:
        reply = self._run("requeue", shard, args)
        self._relay_wake(shard, int(reply[0]) > 0)
        return int(reply[0]), [_stored_id(id) for id in reply[1:]]

    @property
    def trims_dead(self) -> bool:
        """Whether dead letters have a bounded retention (``dead_max_count`` or ``dead_max_age``)."""
        return self.dead_max_count is not None or self.dead_max_age_ms is not None

    def trim_dead(self, shard: int | None = None) -> int:
        """Drop the dead letters past ``dead_max_count`` (oldest first) and those older than ``dead_max_age``,
        with their envelopes, attempts and errors, on one shard or (``None``) on every shard. Returns how many
        were dropped; they are counted in the store's ``dead_dropped`` counter. Does nothing without a bound.

        Enforced by promoters rather than where dead letters are made: letters are made by three scripts
        (claim, nack, direct promotion) and only by promoters, and an age bound needs a periodic look anyway
        (a letter ages without anything happening to it). So each promoter trims a shard right after it
        dead-lettered something there (the count bound holds within one batch) and every shard every
        :data:`delay_broker.promoter.DEAD_TRIM_INTERVAL` seconds (the age bound holds within that).
        """
        if not self.trims_dead:
            return 0
        count = -1 if self.dead_max_count is None else self.dead_max_count
        age = -1 if self.dead_max_age_ms is None else self.dead_max_age_ms
        total = 0
        for one in range(len(self.shards)) if shard is None else (shard,):
            while True:
                dropped, more = self._run("trim_dead", one, [count, age, MAX_BATCH])
                total += int(dropped)
                if not int(more):
                    break
        return total

    def purge_dead(self, ids: Sequence[str] | None = None, *, dead_by_ms: int | None = None) -> int:
        """Delete dead-lettered messages for good. ``ids=None`` purges all those dead-lettered at or before
        ``dead_by_ms`` (Redis clock; by default when the call starts): a purge confirmed for the letters an
        operator saw leaves those that die afterwards."""
        total = 0
        if ids is None:
            until = self.now_ms() if dead_by_ms is None else dead_by_ms
            for shard in range(len(self.shards)):
                while deleted := int(self._run("purge", shard, [MAX_BATCH, until])):
                    total += deleted
            return total
        for shard, group in self._by_shard(ids).items():
            for chunk in _chunks(group):
                total += int(self._run("purge", shard, [MAX_BATCH, 0, *chunk]))
            if shard != 0:
                total += sum(int(self._run("purge", 0, [MAX_BATCH, 0, *chunk])) for chunk in _chunks(group))
        return total


def _due_argument(delay: Delay | None, due: datetime | None, id: str) -> tuple[str, int]:
    """The scripts' (kind, value) for a due time: ``("d", ms from Redis TIME)`` or ``("a", epoch ms)``."""
    if (delay is None) == (due is None):
        raise InvalidDelay(f"give exactly one of delay and due for {id!r}")
    if delay is not None:
        return "d", delay_to_ms(delay)
    return "a", due_to_ms(due)  # type: ignore[arg-type]


def _seconds_text(ms: int) -> str:
    """Milliseconds as the scripts' refusals write them (``seconds_text`` in _lib.lua)."""
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:.3f} s"


def _positive_ms(name: str, value: Delay | None) -> int | None:
    """A duration option (seconds or a timedelta) in milliseconds, > 0; None stays None."""
    if value is None:
        return None
    try:
        millis = delay_to_ms(value)
    except InvalidDelay as error:
        raise ConfigurationError(f"{name}: {error} (give seconds or a timedelta)") from None
    if millis <= 0:
        raise ConfigurationError(f"{name} must be positive, got {value!r}")
    return millis


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _stored_id(raw: bytes) -> str:
    """An id read back from Redis. One that is not UTF-8 was not parked by delay_broker (its ids are text), and is
    shown with its odd bytes escaped rather than failing the whole listing."""
    return raw.decode(errors="backslashreplace")


def _int_or_none(value: bytes | str) -> int | None:
    # Digits only, as park.lua reads a schedule's record: int() would also take ' 12 ', '+12', '-5' or '1_000',
    # which the script refuses, and the two would disagree on the latest occurrence.
    raw = value.encode() if isinstance(value, str) else value
    return int(raw) if raw.isdigit() and raw.isascii() else None


def _push_wake(pipe: Any, key: str, token: str) -> None:
    """Queue on ``pipe`` what the scripts' ``wake_one`` does: ``token`` once at the head of the wake list ``key``."""
    pipe.lrem(key, 0, token)
    pipe.lpush(key, token)


def check_id(id: object) -> str:
    if not isinstance(id, str):
        raise InvalidMessage(f"message id must be a string, got {type(id).__name__}")
    if not id or len(id) > MAX_ID_LENGTH:
        raise InvalidMessage(f"message id must be 1 to {MAX_ID_LENGTH} characters, got {len(id)}")
    return id


def _rounds(ids: list[str]) -> list[list[int]]:
    """Positions of ``ids`` in rounds without a repeated id: the first of each id, then the second ..."""
    seen: dict[str, int] = {}
    rounds: list[list[int]] = []
    for position, id in enumerate(ids):
        occurrence = seen[id] = seen.get(id, -1) + 1
        if occurrence == len(rounds):
            rounds.append([])
        rounds[occurrence].append(position)
    return rounds


def _batch(batch: int) -> int:
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be 1..{MAX_BATCH}, got {batch}")
    return batch


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), MAX_BATCH):
        yield items[start : start + MAX_BATCH]


__all__ = [
    "CLIENT_DEFAULTS",
    "MAX_BATCH",
    "Claim",
    "ClaimedMessage",
    "DelayStore",
    "DirectPromotion",
    "MessageInfo",
    "NackAction",
    "OnConflict",
    "ParkRequest",
    "ParkResult",
    "State",
    "StoreStats",
]


def _listed(
    state: ListState, id: bytes, score: Any, raw: Any, attempts: Any, error: Any, *, omitted: bool = False
) -> tuple[float, MessageInfo]:
    """A message as list.lua and find.lua return it, with its score (``omitted``: asked without payloads)."""
    value = float(score)
    info = MessageInfo(
        id=_stored_id(id),
        state=state,
        due_ms=due_of_score(value) if state == "due" else None,
        at_ms=None if state == "due" else int(value),
        raw=raw or None,
        attempts=int(attempts),
        error=_text(error) if error else None,
        payload_omitted=omitted,
    )
    return value, info
