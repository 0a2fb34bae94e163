"""The store's face: :class:`DelayStore`, which wires the parts of :mod:`delay_broker.store` together and gives
each public operation to the part that does it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from .. import tracing
from ..clock import Delay
from ..connect import AnyRedis, client_from_url, describe
from ..envelope import VERSION as ENVELOPE_VERSION
from ..envelope import Envelope
from ..far import FarTier
from ..keys import DEFAULT_NAMESPACE, DEFAULT_PREFIX, Keyspace
from ..packing import DEFAULT_PACK_AFTER_MS
from ..records import (
    Claim,
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
    StoredSchedules,
    StoreStats,
)
from ..targets import ListTarget
from .encoding import Due
from .options import DEFAULT_MAX_PAYLOAD, STORE_OPTIONS, StoreOptions
from .parts import Parts
from .replies import ListState, check_id
from .resharding import Resharder, ReshardReport
from .shards import Shards, check_client
from .stats import HISTOGRAM_EDGES


class DelayStore:
    """Parked messages of one namespace in one Redis (a server, a Sentinel-managed master, or a Cluster).

    Parameters:
      client: a redis-py client that returns bytes (``decode_responses=False``, the default): ``redis.Redis``
        (also from ``Sentinel.master_for``) or ``redis.cluster.RedisCluster``.
      namespace, prefix: separate independent stores in one Redis; every key carries them.
      max_payload_bytes: larger payloads are refused at park time.
      max_attempts, retry_backoff: promotion attempts before a message is dead-lettered; first and largest wait
        (seconds) before a failed delivery is tried again.
      shards: how many shards (hash tags, so Redis Cluster slots) the namespace spreads over.
      replicas, replica_timeout: durable writes, confirmed by that many replicas within that many seconds.
      max_delay: the furthest due time a park or reschedule accepts, from now.
      dead_max_count, dead_max_age: dead letters kept per shard at most, and for how long.
      record_version: the envelope format written (2, or 1 for a rolling upgrade).
      far_tier, far_horizon: a PostgreSQL tier for messages due beyond the horizon.
      pack_after: messages due at least this far ahead are packed (None: none).

    Each option is described in full at :class:`~delay_broker.store.options.StoreOptions`.
    """

    HISTOGRAM_EDGES = HISTOGRAM_EDGES
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
        check_client(client)
        options = StoreOptions(  # positional, in its fields' order, which is this signature's
            namespace, prefix, max_payload_bytes, max_attempts, retry_backoff, shards, replicas, replica_timeout,
            max_delay, dead_max_count, dead_max_age, record_version, far_tier, far_horizon, pack_after
        )  # fmt: skip
        self.options = options
        self.record_version, self.max_payload_bytes, self.max_attempts = record_version, max_payload_bytes, max_attempts
        self.replicas, self.replica_timeout_ms, self.retry_backoff_ms = (
            replicas, options.replica_timeout_ms, options.retry_backoff_ms
        )  # fmt: skip
        self.pack_after_ms, self.max_delay_ms = options.pack.after_ms, options.max_delay_ms
        self.dead_max_count, self.dead_max_age_ms = dead_max_count, options.dead_max_age_ms
        self._shards = Shards(client, Keyspace(namespace, prefix), shards)
        self.client, self.cluster = client, self._shards.cluster
        self.keys = self._shards.keys
        """The keys of shard 0 (all of them when the namespace is not sharded)."""
        parts = Parts(self._shards, options)
        self.far_tier = parts.far_tier
        self._runner, self._encoder, self._packs = parts.runner, parts.encoder, parts.packs
        self._parking, self._park_one, self._rehoming = parts.parking, parts.park_one, parts.rehoming
        self._far, self._reading, self._tier, self._promotion = parts.far, parts.reading, parts.tier, parts.promotion
        self._dead, self._registry, self._stats = parts.dead, parts.registry, parts.stats

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DelayStore:
        """A store on a new client for ``url``: ``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://host:26379,.../mymaster/0`` or ``redis+cluster://host:port,...`` (see
        :mod:`delay_broker.connect`). Options this class takes (``namespace``, ``shards``, ``replicas``, ...)
        configure the store; every other one goes to the client (``ssl_ca_certs``, ``socket_timeout``, ...)."""
        client_options = {key: options.pop(key) for key in list(options) if key not in STORE_OPTIONS}
        return cls(client_from_url(url, **client_options), **options)

    def __repr__(self) -> str:
        return f"<DelayStore {self.keys.namespace!r} on {describe(self.client)}>"

    # -- shards ----------------------------------------------------------------------------------------

    @property
    def shards(self) -> list[Keyspace]:
        """The key sets of every shard this store knows, by number, shard 0 first: during a reshard both layouts'."""
        return self._shards.spaces

    def refresh_layout(self) -> None:
        """Read the shard layout again (promoters call it every ``max_idle``); during a reshard, finish batches a
        killed ``delay-broker reshard`` left in transit."""
        self._shards.refresh()
        self._rehoming.rescue()

    def reshard(self, to: int, *, dry_run: bool = False, **options: Any) -> ReshardReport:
        """Move the namespace to ``to`` shards while it is used (``delay-broker reshard``; killed, call it again).
        ``dry_run``: where it stands, changing nothing. ``batch``, ``settle``, ``progress``: see :class:`Resharder`."""
        resharder = Resharder(self._shards, self._runner, self._rehoming, self._reading, to, **options)
        return resharder.status() if dry_run else resharder.run()

    def shard_for(self, id: str) -> int:
        """The shard holding message ``id`` (recurring schedules' occurrences live in shard 0)."""
        return self._shards.shard_for(id)

    def now_ms(self) -> int:
        """The Redis server's clock, by which every due time is kept."""
        return self._shards.now_ms()

    def estimated_now_ms(self) -> int:
        """The Redis clock without a round trip (the local clock corrected by an offset read once a minute)."""
        return self._shards.estimated_now_ms()

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
        """Park one message until ``delay`` from now (Redis clock) or until ``due``. ``on_conflict="replace"``
        (debounce) gives an id that is already stored the new payload and due time; ``"keep"`` (dedup) leaves the
        stored one alone and reports it as kept."""
        if on_conflict != "replace" or not self._tier.fast_path or tracing.active():
            return self.park_many([ParkRequest(id, envelope, delay=delay, due=due)], on_conflict=on_conflict)[0]
        # Every adapter's delayed send: one new id, untraced, in one call of the one-message scripts (sent with
        # other threads' parks made at once); anything they leave goes to park.lua with the same parcel.
        parcel = self._encoder.parcel_of(id, envelope, delay, due, None)
        return self._park_one(parcel) or self._tier.park([parcel], on_conflict)[0]

    def park_many(self, requests: Iterable[ParkRequest], *, on_conflict: OnConflict = "replace") -> list[ParkResult]:
        """Park many messages: one round trip per 1000 (per shard), each chunk all or nothing. Every request is
        validated before anything is written."""
        if on_conflict not in ("replace", "keep"):
            raise ValueError(f"on_conflict must be 'replace' or 'keep', got {on_conflict!r}")
        requests = list(requests)
        routes = {request.envelope.route for request in requests if isinstance(request, ParkRequest)}
        with tracing.park_span(len(requests), next(iter(routes)) if len(routes) == 1 else None):
            carrier = tracing.current_carrier()  # once for the batch: the park span's
            parcels = [self._encoder.parcel(request, carrier) for request in requests]
            self._shards.settle_for_parking()  # once the requests are found valid: a refused park writes nothing
            return self._tier.park(parcels, on_conflict)

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
        parcel = self._encoder.parcel_of(id, envelope, None, due, tracing.current_carrier())
        return self._parking.park_occurrence(schedule, parcel, revision)

    def withdraw(self, id: str, payload: bytes) -> bool:
        """After a park of ``payload`` under ``id`` raised :class:`StoreUnavailable`, before the message is sent
        some other way: take back a copy the store may hold. False when that copy is already being promoted, and
        so runs from the store (see :meth:`.tiers.RedisOnly.withdraw`)."""
        return self._tier.withdraw(check_id(id), payload)

    def cancel(self, id: str) -> bool:
        """Remove a parked (or dead-lettered) message. False if it is unknown, gone or being promoted."""
        return self.cancel_many([id]) == 1

    def cancel_many(self, ids: Sequence[str]) -> int:
        return sum(self.cancel_each(ids))

    def cancel_each(self, ids: Sequence[str]) -> list[bool]:
        """Cancel each id (as :meth:`cancel`), one script call per 1,000 per shard; True for each one removed
        (for an id given twice, its first place)."""
        ids = [check_id(id) for id in ids]
        removed = self._tier.cancel(list(dict.fromkeys(ids)))
        first = {id: n for n, id in reversed(list(enumerate(ids)))}
        return [removed[id] and first[id] == n for n, id in enumerate(ids)]

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
        when = Due.of(delay, due, id)
        if expected is not None and (expected.payload_omitted or not expected.raw):
            raise ValueError("expected must be a message read whole by get(), with its envelope")
        read = b"" if expected is None else expected.raw or b""
        # The promote span continues the trace the message was parked in, not the one rescheduling it.
        record = b"" if envelope is None else self._encoder.envelope(id, envelope, keep_context=True, traced=True)
        return self._tier.reschedule(id, when, record, envelope, read)

    # -- routes and schedules --------------------------------------------------------------------------

    def record_routes(self, routes: Iterable[str]) -> None:
        """Remember routes producers parked for, so promoters in other processes may deliver to them.

        Adapters whose queues are not all declared up front (a Celery producer may route anywhere) record
        each route when they park; promoters allow declared routes plus these.
        """
        self._registry.record_routes(routes)

    def recorded_routes(self) -> set[str]:
        return self._registry.recorded_routes()

    def schedules(self) -> dict[str, int | None]:
        """Recurring schedules that parked an occurrence: name -> due time (ms) of the latest one (None when
        the record is malformed). Not the markers kept beside them (run-now, rewound)."""
        return self._registry.schedules()

    def forget_schedule(self, name: str) -> bool:
        """Drop the record of a recurring schedule (its occurrences already parked stay parked). The schedules'
        revision moves on and a promoter is woken, so that schedulers read the records again at once: else
        they would go on from the record they hold for up to a minute."""
        return self._registry.forget_schedule(name)

    def stored_schedules(self) -> StoredSchedules:
        """The runtime schedules' definitions and every schedule's record, read in one round trip.

        The revision is read first: definitions changed in between carry a newer revision than the one
        returned, so a reader that acts on the revision reads them again rather than acting on old ones.
        """
        return self._registry.stored_schedules()

    def schedules_revision(self) -> int:
        """The revision of the runtime schedules' definitions (0 before the first change)."""
        return self._registry.schedules_revision()

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
        return self._registry.update_schedule(
            name, definition, revision, record, record_action, cancel, drop_also, marker
        )

    # -- the far tier ----------------------------------------------------------------------------------

    def sweep_far(self, *, ids: Sequence[str] = ()) -> int:
        """Move the far rows now due within the horizon (or those of ``ids``) into Redis: one transaction of at
        most the tier's ``batch`` rows. Returns how many rows left the table. Promoters call this; any number of
        processes may at once."""
        return self._tier.sweep(list(ids))

    def forget_moved_orphans(self, older_than: float = 300.0) -> int:
        """Delete the far rows whose tokens were recorded as moved in more than ``older_than`` seconds ago (dead
        weight: see :meth:`.sweeping.FarSweeper.forget_orphans`), then drop the tokens."""
        return self._tier.forget_orphans(older_than)

    @contextlib.contextmanager
    def far_snapshot(self) -> Iterator[FarSnapshot | None]:
        """A read of both tiers that sees each message once (None without a tier): open it before reading
        Redis, and give it to every :meth:`scan_far` of the read (see :class:`~.far_view.FarView`)."""
        with self._far.far_snapshot() as snapshot:
            yield snapshot

    # -- inspection ------------------------------------------------------------------------------------

    def get(self, id: str) -> MessageInfo | None:
        return self._reading.get(id)

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
        """
        return self._reading.list_messages(state, start_ms, end_ms, offset, count, headers_only)

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
        return self._reading.scan_index(
            state, shard, min_score, max_score, after, scan, limit, queue, task, id_prefix, headers_only
        )

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
        return self._reading.scan_packs(
            shard, start_ms, end_ms, after, scan, limit, queue, task, id_prefix, headers_only
        )

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
        """:meth:`scan_index` of the far tier (filtered by PostgreSQL: every row examined matches). Positions are a
        row's due time and token. Exhausted at once without a tier. With a ``snapshot`` (:meth:`far_snapshot`,
        opened before Redis was read) a message moving into Redis meanwhile is seen once."""
        return self._far.scan(start_ms, end_ms, after, scan, queue, task, id_prefix, snapshot)

    def iter_all(self, state: ListState = "due", page: int = 500) -> Iterator[MessageInfo]:
        """Every message of a state, page by page, shard after shard (not a snapshot: changes meanwhile may be
        missed; across shards not in time order)."""
        return self._reading.iter_all(state, page)

    def stats(self, heartbeat_window: float = 30.0) -> StoreStats:
        """Counts over every shard: one script per shard, each a consistent snapshot of its shard."""
        return self._stats.stats(heartbeat_window)

    def promotion_lateness(self) -> list[tuple[str, int]]:
        """Messages promoted so far, store-wide, by how late (ms after their due time): ``("10", n)`` for under
        10 ms, then 100, 1000, 10000, 60000 and ``"more"`` (counted by the promote and ack scripts)."""
        return self._stats.promotion_lateness()

    # -- promoters -------------------------------------------------------------------------------------

    def claim(self, batch: int, lease: float, promoter_id: str, *, shard: int = 0, ahead: float = 0.0) -> Claim:
        """Lease up to ``batch`` due messages of one shard for ``lease`` seconds (at-least-once promotion).
        Expired leases of other promoters are given back first. Deliver each message, then :meth:`ack` it
        (or :meth:`nack` it) with the claim's ``lease_deadline_ms`` and ``shard`` before the lease runs out.
        ``ahead``: seconds before their due time messages count as due (see :class:`~delay_broker.Promoter`)."""
        return self._promotion.claim(batch, lease, promoter_id, shard, ahead)

    def ack(self, lease_deadline_ms: int, ids: Sequence[str], *, shard: int = 0) -> int:
        """Forget delivered messages whose lease (identified by its deadline) this promoter still holds."""
        return self._promotion.ack(lease_deadline_ms, ids, shard)

    def renew(self, lease_deadline_ms: int, ids: Sequence[str], lease: float, *, shard: int = 0) -> tuple[int, int]:
        """Extend by ``lease`` seconds the lease of ``ids``, still held with ``lease_deadline_ms``, while their
        delivery goes on. Returns the new deadline (the token for :meth:`ack`/:meth:`nack` from now on) and how
        many ids it holds; ids another promoter reclaimed are not among them."""
        return self._promotion.renew(lease_deadline_ms, ids, lease, shard)

    def nack(
        self, lease_deadline_ms: int, failures: Sequence[tuple[str, str, NackAction]], *, shard: int = 0
    ) -> list[str]:
        """Give back claimed messages that were not delivered: ``(id, reason, action)`` each. ``"retry"`` tries
        again after an exponential backoff until ``max_attempts``, then dead-letters; ``"dead"`` dead-letters at
        once with the reason; ``"release"`` puts the message back at its due time without counting an attempt
        (the promoter is stopping, or the target broker is down). Returns ``"retried"``, ``"dead"``,
        ``"released"`` or ``"not held"`` per message."""
        return self._promotion.nack(lease_deadline_ms, failures, shard)

    def check_direct(self, routes: Mapping[str, ListTarget]) -> None:
        """Refuse exactly-once promotion into ``routes`` when it cannot be one atomic script: on a Redis Cluster
        every target key must sit in the slot of every shard of the namespace (so: one shard, and targets whose
        hash tag is the namespace's). Raises :class:`ConfigurationError` saying so."""
        self._promotion.check_direct(routes)

    @property
    def pack_lead_ms(self) -> int:
        """How long before a pack's earliest due time promoters open it: half of ``pack_after`` (of the default
        when this store packs nothing: others may)."""
        return self.options.pack.lead_ms

    def open_packs(self, shard: int, *, calls: int = 8) -> int | None:
        """Move the shard's packs whose earliest message is due within :attr:`pack_lead_ms` into the ordinary
        layout, at most ``calls`` chunks (promoters call this). Returns when the next pack is to be opened (ms,
        Redis clock; now or earlier when there is more to open already), or None when nothing is packed."""
        return self._packs.open(shard, calls)

    def promote_direct(
        self,
        routes: Mapping[str, ListTarget],
        batch: int,
        promoter_id: str,
        *,
        shard: int = 0,
        lateness: bool = True,
        ahead: float = 0.0,
    ) -> DirectPromotion:
        """Move due messages of one shard straight into Redis lists of its server, exactly once
        (``promote_list.lua``); ``lateness=False`` saves reading each one's score (only counted by bucket).
        ``ahead``: seconds before their due time messages count as due (see :class:`~delay_broker.Promoter`).
        Messages whose route is not in ``routes`` are dead-lettered: a stored message can only reach the
        queues the application declared. With no route declared yet, nothing is promoted."""
        return self._promotion.promote_direct(routes, batch, promoter_id, shard, lateness, ahead)

    def wait_for_wake(self, timeout: float, promoter_id: str) -> frozenset[int] | None:
        """Block until a park moves a shard's head earlier, :meth:`wake` is called for this promoter, or timeout.
        Returns the shards to look at again (every shard after :meth:`wake`), or None on timeout. Uses BLPOP
        on shard 0's wake lists, so a sleeping promoter costs Redis nothing."""
        return self._promotion.wait_for_wake(timeout, promoter_id)

    def wake(self, promoter_id: str) -> None:
        """Wake one particular sleeping promoter (used to stop it without waiting out its sleep)."""
        self._promotion.wake(promoter_id)

    def eviction_policies(self) -> dict[str, str]:
        """The masters of this store's shards that may evict keys (a ``maxmemory`` and a policy other than
        ``noeviction``), each with its policy: such a server deletes parked messages silently when it fills up.
        Empty when none may, or when the user may not read the settings (no ``+info``)."""
        return self._promotion.eviction_policies()

    def forget_promoter(self, promoter_id: str) -> None:
        """Remove a stopped promoter's heartbeats and stop marker."""
        self._promotion.forget_promoter(promoter_id)

    def set_record(self, key: str, value: bytes, ttl_ms: int, shard: int) -> None:
        """``SET key value PX ttl_ms`` on ``shard``, confirmed by the ``replicas`` (else :class:`NotReplicated`)."""
        with self._shards.calling("writing a record"):
            self._runner.replication.set(self._shards.spaces[shard], key, value, ttl_ms)

    # -- dead letters ----------------------------------------------------------------------------------

    def requeue_dead(self, ids: Sequence[str] | None = None, *, dead_by_ms: int | None = None) -> Requeued:
        """Park dead-lettered messages again, due now, attempts reset. ``ids=None`` requeues all those
        dead-lettered at or before ``dead_by_ms`` (Redis clock; by default when the call starts): a letter
        that dies again meanwhile stays, instead of being requeued again and again while a cause persists.

        Dead letters with no payload (nothing to requeue) stay; purge them with :meth:`purge_dead`.
        """
        return self._dead.requeue(ids, dead_by_ms)

    @property
    def trims_dead(self) -> bool:
        """Whether dead letters have a bounded retention (``dead_max_count`` or ``dead_max_age``)."""
        return self._dead.trims

    def trim_dead(self, shard: int | None = None) -> int:
        """Drop the dead letters past ``dead_max_count`` (oldest first) and those older than ``dead_max_age``,
        with their envelopes, attempts and errors, on one shard or (``None``) on every shard. Returns how many
        were dropped; they are counted in the store's ``dead_dropped`` counter. Does nothing without a bound.
        Promoters call it (see :meth:`.dead_letters.DeadLetters.trim` for when)."""
        return self._dead.trim(shard)

    def purge_dead(self, ids: Sequence[str] | None = None, *, dead_by_ms: int | None = None) -> int:
        """Delete dead-lettered messages for good. ``ids=None`` purges all those dead-lettered at or before
        ``dead_by_ms`` (Redis clock; by default when the call starts): a purge confirmed for the letters an
        operator saw leaves those that die afterwards."""
        return self._dead.purge(ids, dead_by_ms)
