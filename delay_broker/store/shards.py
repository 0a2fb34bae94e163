"""The namespace's shards on one Redis: the client, the key sets, the layout recorded in Redis (read again as it
changes), the Redis clock, redis-py's errors as delay_broker's, and the relay that wakes promoters for any shard."""

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
from ..errors import ConfigurationError, DelayBrokerError, LayoutChanged, SlotMigrating, StoreError
from ..keys import Keyspace, shard_tags
from ..redis_errors import ask_to_unknown_node, translate
from .layouts import LAYOUT_TTL, Layout, View

logger = logging.getLogger("delay_broker.store")

RedisFailure = (redis.RedisError, RedisClusterException)
"""What redis-py raises: a server's refusal, a connection lost, a Cluster that cannot route."""
ClusterFailure = (*RedisFailure, AttributeError)
"""The same, and the ``AttributeError`` redis-py raises on an ``ASK`` to a master it does not know yet (see
:func:`~delay_broker.redis_errors.ask_to_unknown_node`); any other ``AttributeError`` is raised again as it is."""
LAYOUT_WAIT = 5.0
"""Seconds a park refused by a shard's newer layout generation waits for the layout key to say it."""


class Shards:
    """The shards of one namespace: which ones there are, where a message lives, and how to talk to Redis.

    The layout is read from the namespace (``requested``, when given, is recorded there the first time and checked
    against it after), so every process of an application sees the same shards, and read again as it is used, so
    that a reshard is followed (see :mod:`~delay_broker.store.layouts`).
    """

    def __init__(self, client: AnyRedis, keys: Keyspace, requested: int | None) -> None:
        self.client = client
        self.cluster = is_cluster(client)
        self.keys = keys
        """The keys of shard 0 (all of them when the namespace is not sharded)."""
        self._requested = requested
        self._checked = False
        self._spaces: list[Keyspace] = []
        self._numbers: dict[str, int] = {}
        """Shard tag -> the shard's number in this process."""
        self._view: View | None = None
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._master: tuple[str, int] | None = None
        self._wake_tokens: dict[bytes, int] = {}
        self._unrecordable = False
        self._unreadable = ""
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

    def view(self, doing: str = "reading the shard layout") -> View:
        """The layout this process parks and reads by: read from the namespace on first use, and again when it is
        used more than :data:`~.layouts.LAYOUT_TTL` after its last read (so a reshard is seen within it)."""
        view = self._view
        if view is not None and time.monotonic() - self._read_at < LAYOUT_TTL:
            return view
        return self._reread(doing)

    def _reread(self, doing: str) -> View:
        with self._lock:
            view = self._view
            if view is not None and time.monotonic() - self._read_at < LAYOUT_TTL:
                return view  # read by another thread meanwhile
            try:
                layout = self._fetch(doing)
            except DelayBrokerError as error:
                if view is None:
                    raise
                # Not read again before LAYOUT_TTL: in an outage a call makes one attempt to reach Redis, not two.
                self._read_at = time.monotonic()
                if isinstance(error, StoreError):
                    raise  # Redis away: the call would fail the same way
                # A layout this release cannot read: the last one read stays.
                logger.warning(
                    "Store %r: cannot read the shard layout, keeping the last one: %s", self.keys.namespace, error
                )
                return view
            return self._adopt(layout)

    @property
    def spaces(self) -> list[Keyspace]:
        """The key sets of every shard this process knows, by number, shard 0 first. Numbers never change meaning:
        during a reshard the new layout's shards are added, and once it is finished the old ones are retired (see
        :attr:`serving`), not removed."""
        self.view()
        return self._spaces

    def layout(self, doing: str) -> list[Keyspace]:
        """:attr:`spaces`, read from the namespace on first use with ``doing`` as what a failure says."""
        self.view(doing)
        return self._spaces

    def space(self, shard: int, doing: str) -> Keyspace:
        spaces = self._spaces
        return spaces[shard] if shard < len(spaces) else self.layout(doing)[shard]

    @property
    def serving(self) -> tuple[int, ...]:
        """The shards of the layouts in use: both during a reshard (promoters serve them, counts and lists read
        them), the new layout's alone after it."""
        return self.view().serving

    def retired(self, shard: int) -> bool:
        """Whether ``shard`` belongs to a layout a finished reshard left (empty, and refusing parks)."""
        return shard not in self.view().serving

    @property
    def count(self) -> int:
        """The namespace's shard count: the layout parks go to."""
        return self.view().layout.shards

    def refresh(self) -> None:
        """Read the layout again now (promoters call it every ``max_idle``): a store that took the default of one
        shard then serves the shards a later process recorded, and a reshard is seen. Raises
        :class:`StoreUnavailable` when Redis is away, as the calls after it would."""
        self._read_at = float("-inf")
        self.view()

    def reload(self, doing: str = "reading the shard layout") -> View:
        """The layout read again now, a failure raised (a reshard's steps read it so)."""
        with self._lock:
            return self._adopt(self._fetch(doing))

    def follow(self, refused: LayoutChanged) -> View:
        """After a park refused because the shard's layout generation is newer than this process's: the layout
        read again until it has that generation (the reshard writes its layout key a moment before the markers),
        for :data:`LAYOUT_WAIT` seconds at most; then :class:`LayoutChanged` saying so."""
        deadline = time.monotonic() + LAYOUT_WAIT
        pause = 0.01
        while True:
            self._read_at = float("-inf")
            view = self.view("reading the shard layout")
            if view.generation >= refused.generation:
                return view
            if time.monotonic() >= deadline:
                raise LayoutChanged(
                    f"namespace {self.keys.namespace!r}: a shard refused a park made by layout generation "
                    f"{view.generation}, it has generation {refused.generation}, and {self.keys.layout} still says "
                    f"{view.generation} after {LAYOUT_WAIT:.0f} s (a reshard interrupted between its two writes: run "
                    "`delay-broker reshard` again); nothing was written"
                )
            time.sleep(pause)
            pause = min(2 * pause, 0.2)

    def settle_for_parking(self) -> None:
        """Before the first park of a store given no shard count: record one shard, unless a count is recorded
        by then (which it takes). A process given another count later is refused, instead of parking a second
        copy of an id in a shard this one never looks in (and this one parking into shard 0 for ever)."""
        if self.view("park").layout.recorded or self._unrecordable:
            return
        with self._lock:
            view = self._view
            if (view is not None and view.layout.recorded) or self._unrecordable:  # by another thread meanwhile
                return
            try:
                layout = self._fetch("recording the shard layout", record=1)
            except DelayBrokerError as error:
                if not isinstance(error.__cause__, redis.exceptions.NoPermissionError):
                    raise
                # An ACL written before this was recorded here (without +set): park as before, and say so.
                self._unrecordable = True
                logger.warning("Store %r: cannot record its shard count (%s); allow +set.", self.keys.namespace, error)
                return
            self._adopt(layout)

    def _fetch(self, doing: str, *, record: int | None = None) -> Layout:
        wanted = self._requested
        recording = wanted if wanted is not None else record
        with self.calling(doing):
            raw = self.client.get(self.keys.layout)
            if raw is None and recording is not None:
                # Recorded even when it is 1: a later process given another number is refused, not obeyed.
                self.client.set(self.keys.layout, recording, nx=True)
                raw = self.client.get(self.keys.layout)
        layout = Layout.parse(raw, self.keys.layout)
        if wanted is not None and not self._checked:
            self._check_requested(wanted, layout)
        return layout

    def _check_requested(self, wanted: int, layout: Layout) -> None:
        """A count given to this store is checked against the first layout read: a reshard under way to or from it
        is followed (said once), anything else refused. Later changes (a reshard) are followed without a word."""
        if wanted == layout.shards or (layout.state != "stable" and wanted == layout.other):
            if wanted != layout.shards:
                logger.warning(
                    "Store %r: given shards=%d while the namespace is resharded (%s): following the layout.",
                    self.keys.namespace,
                    wanted,
                    layout.describe(),
                )
            self._checked = True
            return
        since = f", resharded from {layout.other}" if layout.other is not None else ""
        raise ConfigurationError(
            f"namespace {self.keys.namespace!r} has {layout.shards} shard(s){since} ({self.keys.layout}), this "
            f"store was given shards={wanted}: every process of an application must use the same number (leave it "
            "out to take the namespace's; `delay-broker reshard --to N` changes it)"
        )

    def _adopt(self, layout: Layout) -> View:
        """The view of ``layout``: its shards numbered, new ones after those this process knew."""
        namespace, prefix = self.keys.namespace, self.keys.prefix
        spaces, numbers = self._spaces, self._numbers

        def numbered(count: int) -> tuple[int, ...]:
            found = []
            for tag in shard_tags(namespace, count):
                if tag not in numbers:
                    numbers[tag] = len(spaces)
                    spaces.append(Keyspace(namespace, prefix, tag))
                found.append(numbers[tag])
            return tuple(found)

        old = numbered(layout.source) if layout.state != "stable" else None
        homes = numbered(layout.shards)
        new = numbered(layout.target) if layout.state != "stable" else None
        serving = tuple(sorted({*homes, *(old or ()), *(new or ())}))
        view = View(layout, homes, old, new, serving)
        previous = self._view
        if previous is not None and _said(previous.layout) != _said(layout):
            logger.info("Store %r: the namespace now has %s.", namespace, layout.describe())
        self._wake_tokens = {space.wake.encode(): n for n, space in enumerate(spaces)}
        self._view, self._read_at = view, time.monotonic()
        if previous is None:
            with contextlib.suppress(redis.RedisError):
                self._master = master_address(self.client)
        return view

    # -- where messages live ---------------------------------------------------------------------------

    def shard_for(self, id: str) -> int:
        """The shard a park of ``id`` goes to (recurring schedules' occurrences live in shard 0)."""
        return self.view().home(id)

    def by_shard(self, ids: Iterable[str]) -> dict[int, list[str]]:
        view = self.view()
        groups: dict[int, list[str]] = {}
        for id in ids:
            groups.setdefault(view.home(id), []).append(id)
        return groups

    def to_search(self, id: str) -> list[int]:
        """The shards that may hold ``id``, in the order to look (see :meth:`View.to_search`)."""
        return self.view().to_search(id)

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
        return frozenset(self.serving) if shard is None else frozenset((shard,))


def _said(layout: Layout) -> tuple[int, int, str]:
    """What a change of layout is logged for (not its being recorded, nor a reshard's times)."""
    return layout.shards, layout.generation, layout.state


def check_client(client: AnyRedis) -> None:
    if client.get_connection_kwargs().get("decode_responses"):
        raise DelayBrokerError("the Redis client must return bytes: create it with decode_responses=False")


def push_wake(pipe: Any, key: str, token: str) -> None:
    """Queue on ``pipe`` what the scripts' ``wake_one`` does: ``token`` once at the head of the wake list ``key``."""
    pipe.lrem(key, 0, token)
    pipe.lpush(key, token)
