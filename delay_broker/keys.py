"""Redis key names of one delay store namespace, and of its shards.

Every key of a shard carries the same Redis Cluster hash tag, so each Lua script touches a single slot. Shard
0 of a namespace is tagged ``{namespace}`` (the layout of unsharded stores); shard ``i`` gets a tag of its own
chosen so that the shards' slots are spread evenly over the 16384 slots (see :func:`shard_tag`). This module
is the only place that spells key names, and :data:`SCRIPT_KEYS` the only place that orders them: every
script receives the keys of one shard it names, in that order, so a shard is just another key set.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache, cached_property

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

DEFAULT_PREFIX = "delay_broker"
DEFAULT_NAMESPACE = "default"
MAX_SHARDS = 1024

SCRIPT_KEYS = (
    "due",
    "msg",
    "inflight",
    "leased",
    "dead",
    "attempts",
    "errors",
    "wake",
    "stats",
    "promoters",
    "routes",
    "cron",
    "schedules",
    "schedules_rev",
    "lateness",
    "moved",
    "packs",
    "pack_base",
    "pack_live",
    "packed_shape",
    "generation",
    "moving",
    "rehomed",
)
"""The keys of a shard, in the order every script receives them as KEYS (Lua names them in upper case)."""


def lua_key_names(names: Iterable[str] = SCRIPT_KEYS) -> str:
    """The Lua prelude naming the keys a script receives: ``names``, of :data:`SCRIPT_KEYS` and in its order
    (``local DUE = KEYS[1]`` ...), then where the keys of the call's own begin."""
    used = [name for name in SCRIPT_KEYS if name in set(names)]
    lines = [f"local {name.upper()} = KEYS[{n}]" for n, name in enumerate(used, start=1)]
    lines.append(f"local FIRST_EXTRA_KEY = {len(used) + 1}  -- route targets, packs, a promoter's own wake list")
    return "\n".join(lines) + "\n"


def _bucket(tag: str, shards: int) -> int:
    return key_slot(tag.encode()) * shards // REDIS_CLUSTER_HASH_SLOTS


@cache
def shard_tags(namespace: str, shards: int) -> tuple[str, ...]:
    """The hash tags of a namespace's shards: ``namespace`` for shard 0, then one per share of the slots.

    Shard ``i`` is tagged ``namespace#i`` or, when that slot's share of the slot range is taken,
    ``namespace#i.j`` for the first ``j`` that lands in a free share. The N shards thus sit in N different
    N-ths of the slot range, and a cluster whose masters own equal contiguous ranges (what
    ``redis-cli --cluster create`` makes) gets an even share of them.
    """
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be 1..{MAX_SHARDS}, got {shards}")
    free = [bucket for bucket in range(shards) if bucket != _bucket(namespace, shards)]
    tags = [namespace]
    for shard, target in enumerate(free, start=1):
        candidate, attempt = f"{namespace}#{shard}", 0
        while _bucket(candidate, shards) != target:
            attempt += 1
            candidate = f"{namespace}#{shard}.{attempt}"
        tags.append(candidate)
    return tuple(tags)


_SHARD_SUFFIX = re.compile(r"#\d+(?:\.\d+)?$")
"""How shard tags end (``namespace#3``, ``namespace#3.1``): no namespace may, or it would share their keys."""


def shard_of(id: str, shards: int) -> int:
    """The shard holding message ``id``: a stable hash, the same in every process and version."""
    return 0 if shards == 1 else zlib.crc32(id.encode()) % shards


@dataclass(frozen=True)
class Keyspace:
    """The key names of one shard of a namespace, e.g. ``delay_broker:{default}:due`` for shard 0."""

    namespace: str = DEFAULT_NAMESPACE
    prefix: str = DEFAULT_PREFIX
    tag: str = field(default="")
    """The hash tag of the shard; the namespace itself (shard 0) when not given."""

    def __post_init__(self) -> None:
        for label, value in (("namespace", self.namespace), ("prefix", self.prefix)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{label} must be a non-empty string, got {value!r}")
            if any(c in value for c in "{}") or any(c.isspace() for c in value):
                raise ValueError(f"{label} must not contain braces or white space, got {value!r}")
        if _SHARD_SUFFIX.search(self.namespace):
            raise ValueError(
                f"namespace must not end like a shard's tag (#N or #N.M), got {self.namespace!r}: its keys would be "
                "those of a shard of another namespace"
            )
        if not self.tag:
            object.__setattr__(self, "tag", self.namespace)

    @classmethod
    def shards_of(cls, namespace: str, prefix: str, shards: int) -> list[Keyspace]:
        """The key sets of every shard of a namespace, shard 0 first."""
        return [cls(namespace, prefix, tag) for tag in shard_tags(namespace, shards)]

    def key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{name}"

    # The fixed keys below are cached: a park of 1,000 messages named the same few keys thousands of times.

    @cached_property
    def pattern(self) -> str:
        """A glob matching every key of this shard (for ACLs and inspection)."""
        return f"{self.prefix}:{{{self.tag}}}:*"

    @cached_property
    def script_keys(self) -> tuple[str, ...]:
        """Every key of this shard that scripts take, in :data:`SCRIPT_KEYS` order."""
        return tuple(self.key(name) for name in SCRIPT_KEYS)

    def keys_of(self, names: frozenset[str]) -> tuple[str, ...]:
        """The KEYS a script using ``names`` receives: those of this shard, in :data:`SCRIPT_KEYS` order (each
        script gets only the keys it names: every key sent costs every call)."""
        found = self._keys_by_use.get(names)
        if found is None:
            found = self._keys_by_use[names] = tuple(self.key(name) for name in SCRIPT_KEYS if name in names)
        return found

    @cached_property
    def _keys_by_use(self) -> dict[frozenset[str], tuple[str, ...]]:
        return {}

    def all(self) -> list[str]:
        """Every fixed key of the shard (per-promoter stop markers expire by themselves)."""
        return [*self.script_keys, self.layout]

    @cached_property
    def guard(self) -> str:
        """Never written: on a Redis Cluster every script is also given this key, so that none runs while its slot
        migrates. Redis refuses a call of several keys with one missing on the node that has the slot (TRYAGAIN,
        or ASK and then TRYAGAIN on the node it goes to) before running it; a script let in there because all its
        keys were present would fail at its first touch of a key it deleted itself, after its writes before."""
        return self.key("slot-guard")

    @cached_property
    def layout(self) -> str:
        """STRING: the namespace's shard layout: its number of shards, or after a reshard a JSON object with its
        generation (shard 0 only; absent means one shard; see :mod:`delay_broker.store.layouts`)."""
        return self.key("shards")

    @cached_property
    def due(self) -> str:
        """ZSET id -> encoded due time (see :mod:`delay_broker.clock`)."""
        return self.key("due")

    @cached_property
    def msg(self) -> str:
        """HASH id -> envelope bytes."""
        return self.key("msg")

    @cached_property
    def inflight(self) -> str:
        """ZSET id -> lease deadline (ms) of messages claimed by an at-least-once promoter."""
        return self.key("inflight")

    @cached_property
    def leased(self) -> str:
        """HASH id -> due score a claimed message had, so a lost lease gives it back unchanged."""
        return self.key("leased")

    @cached_property
    def dead(self) -> str:
        """ZSET id -> time (ms) it was dead-lettered."""
        return self.key("dead")

    @cached_property
    def attempts(self) -> str:
        """HASH id -> failed promotion attempts."""
        return self.key("attempts")

    @cached_property
    def errors(self) -> str:
        """HASH id -> last promotion error (text)."""
        return self.key("errors")

    @cached_property
    def wake(self) -> str:
        """LIST a sleeping promoter blocks on; pushed when a park moves the head earlier."""
        return self.key("wake")

    def wake_one(self, promoter_id: str) -> str:
        """LIST only one promoter blocks on, so it can be stopped without waking the others."""
        return self.key(f"wake:{promoter_id}")

    @cached_property
    def stats(self) -> str:
        """HASH counter name -> total (parked, promoted, dead_lettered, ...)."""
        return self.key("stats")

    @cached_property
    def routes(self) -> str:
        """SET of routes producers parked for (adapters whose queues are not all declared up front)."""
        return self.key("routes")

    @cached_property
    def cron(self) -> str:
        """HASH schedule name -> due time (ms) of the latest occurrence parked for that recurring schedule."""
        return self.key("cron")

    @cached_property
    def schedules(self) -> str:
        """HASH schedule name -> definition (JSON) of a schedule managed at runtime (:mod:`delay_broker.schedules`)."""
        return self.key("schedules")

    @cached_property
    def schedules_rev(self) -> str:
        """STRING revision of :attr:`schedules`, incremented by every change: schedulers re-read on a change."""
        return self.key("schedules_rev")

    @cached_property
    def lateness(self) -> str:
        """HASH lateness bucket (upper edge in ms, or 'more') -> messages promoted that late, all time."""
        return self.key("lateness")

    @cached_property
    def moved(self) -> str:
        """ZSET far-tier token -> when its message was moved into Redis (see :mod:`delay_broker.far`)."""
        return self.key("moved")

    @cached_property
    def packs(self) -> str:
        """ZSET pack name -> earliest due time (ms) of the messages packed in it (see :mod:`delay_broker.packing`)."""
        return self.key("packs")

    @cached_property
    def pack_base(self) -> str:
        """HASH pack name -> records taken from the head of the pack so far (positions are counted from its start)."""
        return self.key("pack_base")

    @cached_property
    def pack_live(self) -> str:
        """HASH pack name -> messages still packed in it (its records less the taken and the cleared ones)."""
        return self.key("pack_live")

    def pack(self, name: str) -> str:
        """LIST of the records packed under ``name`` (a level and a time slot, ``3:5863412``)."""
        return self.key(f"pack:{name}")

    def packed(self, partition: int) -> str:
        """HASH 16-byte id -> location (``pack name:position``): one partition of the packed index."""
        return self.key(f"packed:{partition}")

    @cached_property
    def packed_shape(self) -> str:
        """STRING ``level:split``, how many partitions the packed index has (see :class:`~.packing.IndexShape`);
        absent means one."""
        return self.key("packed_shape")

    @cached_property
    def generation(self) -> str:
        """STRING: the layout generation parks into this shard must be made by, at least (absent means 0; see
        :mod:`delay_broker.store.layouts`)."""
        return self.key("generation")

    @cached_property
    def moving(self) -> str:
        """HASH id -> a message a reshard took out of this shard and has not yet dropped (see
        :mod:`delay_broker.store.rehoming`)."""
        return self.key("moving")

    @cached_property
    def rehomed(self) -> str:
        """SET of the tokens of the reshard batches parked into this shard (each is parked once)."""
        return self.key("rehomed")

    @cached_property
    def reshard_lock(self) -> str:
        """STRING, short-lived: held by the ``delay-broker reshard`` at work on the namespace (shard 0 only)."""
        return self.key("reshard")

    @cached_property
    def promoters(self) -> str:
        """ZSET promoter id -> last heartbeat (ms)."""
        return self.key("promoters")

    def claim(self, token: str) -> str:
        """STRING, short-lived: taken by the first process that offers ``token`` (see :mod:`delay_broker.claims`)."""
        return self.key(f"claim:{token}")

    def once(self, id: str, promotion: str, attempt: int) -> str:
        """STRING, expiring: the execution of one delivery of a promoted message (see :mod:`delay_broker.once`).
        The promotion token and the attempt are digits, so the id (any text) comes last, unambiguously."""
        return self.key(f"once:{promotion}:{attempt}:{id}")
