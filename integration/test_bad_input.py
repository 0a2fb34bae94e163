"""Bad input, table-driven, against a real redis-server: every case gets a clear error naming the problem or a
dead letter with a reason, and a promoter running beside it never dies: after each case it still promotes a
good message.

Three tables:

- ``PRODUCER_CASES``: what a caller can pass to ``park``/``reschedule`` (delays, due times, ids, payloads,
  an unreachable Redis). Refused with an error that names the problem; nothing is written.
- ``PLANTED_CASES``: records written into Redis behind the store's back (malformed or truncated envelopes, a
  member with no payload, an undeclared route, ...), on both promotion paths. Dead-lettered with a reason.
- ``WRONG_TYPE_CASES``: a store key (or the target queue) holding the wrong type of value. The store refuses
  to run with an error naming the key and changes nothing; the promoter logs, backs off, and carries on once
  the key is fixed; no parked message is lost meanwhile.

Framework-specific cases (a Celery content type, a Dramatiq queue) are in the adapters' own suites.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
import redis

from delay_broker import (
    DelayBrokerError,
    DelayStore,
    Envelope,
    InvalidDelay,
    InvalidMessage,
    ListTarget,
    ParkRequest,
    PayloadTooLarge,
    Promoter,
    StoreUnavailable,
)
from delay_broker.clock import MAX_DUE_MS
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.embedded import EmbeddedRedis
from tests.helpers import wait_for as shared_wait_for

GOOD = Envelope(route="ready", payload=b"good")


wait_for = functools.partial(shared_wait_for, timeout=20.0)


@dataclass
class World:
    """One namespace with a promoter thread running on it, and what a case needs to poke at it."""

    client: redis.Redis
    store: DelayStore
    ready: str
    hashed: str
    promoter: Promoter

    @property
    def keys(self) -> Any:
        return self.store.keys

    def delivered(self) -> list[bytes]:
        return list(self.client.lrange(self.ready, 0, -1))

    def assert_still_promoting(self, timeout: float = 20.0) -> None:
        """A good message parked now reaches the target: the promoter is alive and working."""
        token = f"good-{uuid.uuid4().hex[:8]}"
        self.store.park(token, Envelope(route="ready", payload=token.encode()), delay=0)
        wait_for(lambda: token.encode() in self.delivered(), timeout=timeout, what=f"good message {token} promoted")
        # On the at-least-once path the push comes before the ack: the promotion is over once the store
        # no longer holds the message.
        wait_for(lambda: self.store.get(token) is None, timeout=timeout, what=f"good message {token} acknowledged")
        assert self.promoter.running, "the promoter thread died"

    def plant(self, id: str, raw: bytes | None) -> None:
        """Write a parked member straight into Redis, due now (``raw=None``: no payload at all)."""
        if raw is not None:
            self.client.hset(self.keys.msg, id, raw)
        self.client.zadd(self.keys.due, {id: (int(self.client.time()[0]) - 1) * 1000 * 1024})


@pytest.fixture(params=["exactly-once", "at-least-once"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_world(server: EmbeddedRedis, path: str) -> Iterator[World]:
    client = server.client(socket_timeout=10)
    namespace = f"bad-{uuid.uuid4().hex[:10]}"
    store = DelayStore(client, namespace=namespace, max_payload_bytes=1024, retry_backoff=(0.05, 0.2))
    ready, hashed = f"{namespace}:ready", f"{namespace}:hashed"
    targets = {
        "ready": ListTarget(ready, mode="rpush"),
        "hashed": ListTarget(hashed, mode="hash", hash_key=f"{hashed}.msgs"),
    }
    deliverer = DirectLists(targets) if path == "exactly-once" else ListDeliverer(client, targets)
    promoter = Promoter(store, deliverer, max_idle=0.2, lease=5).start()
    world = World(client, store, ready, hashed, promoter)
    try:
        world.assert_still_promoting()
        yield world
    finally:
        promoter.stop()
        assert not promoter.running
        client.delete(*client.scan_iter(match=f"*{namespace}*"))
        client.close()


@pytest.fixture
def world(redis_server: EmbeddedRedis) -> Iterator[World]:
    yield from make_world(redis_server, "exactly-once")


@pytest.fixture
def world_on_path(redis_server: EmbeddedRedis, path: str) -> Iterator[World]:
    yield from make_world(redis_server, path)


# -- what a caller passes ---------------------------------------------------------------------------------------

AWARE_PLUS_5 = datetime(2031, 3, 4, 17, 0, tzinfo=timezone(timedelta(hours=5)))


@dataclass(frozen=True)
class ProducerCase:
    name: str
    call: Callable[[DelayStore], object]
    error: type[Exception] | None
    """None: accepted (the check then is ``accepted``)."""
    match: str = ""
    accepted: Callable[[World, object], None] | None = None


def park(id: str = "m", **options: Any) -> Callable[[DelayStore], object]:
    envelope = options.pop("envelope", Envelope(route="ready", payload=b"m"))
    return lambda store: store.park(id, envelope, **options)


def check_aware_due(world: World, result: object) -> None:
    expected = int(datetime(2031, 3, 4, 12, 0, tzinfo=timezone.utc).timestamp() * 1000)
    info = world.store.get("m")
    assert info is not None and info.due_ms == expected == getattr(result, "due_ms", None)


def check_past_due_is_due_now(world: World, result: object) -> None:
    wait_for(lambda: b"m" in world.delivered(), what="a message due in the past promoted at once")


PRODUCER_CASES = [
    ProducerCase("delay NaN", park(delay=math.nan), InvalidDelay, "delay is NaN"),
    ProducerCase("delay Decimal NaN", park(delay=Decimal("NaN")), InvalidDelay, "delay is NaN"),
    ProducerCase("delay signalling NaN", park(delay=Decimal("sNaN")), InvalidDelay, "not a usable number"),
    ProducerCase("delay +infinite", park(delay=math.inf), InvalidDelay, "infinite"),
    ProducerCase("delay -infinite", park(delay=-math.inf), InvalidDelay, "infinite"),
    ProducerCase("delay negative", park(delay=-5), InvalidDelay, "must not be negative"),
    ProducerCase("delay negative timedelta", park(delay=timedelta(minutes=-1)), InvalidDelay, "must not be negative"),
    ProducerCase("delay huge float", park(delay=1e300), InvalidDelay, "latest supported"),
    ProducerCase("delay huge int", park(delay=10**400), InvalidDelay, "too large"),
    ProducerCase("delay huge timedelta", park(delay=timedelta.max), InvalidDelay, "latest supported"),
    ProducerCase(
        "delay past 2248 only once added to now (checked in Lua)",
        park(delay=MAX_DUE_MS / 1000 - 1),
        InvalidDelay,
        "past the latest supported",
    ),
    ProducerCase("delay a string", park(delay="60"), InvalidDelay, "number of seconds or a timedelta, got str"),
    ProducerCase("delay bytes", park(delay=b"60"), InvalidDelay, "got bytes"),
    ProducerCase("delay a bool", park(delay=True), InvalidDelay, "got bool"),
    ProducerCase("delay None and no due", park(delay=None), InvalidDelay, "exactly one of delay and due"),
    ProducerCase("delay and due both", park(delay=1, due=AWARE_PLUS_5), InvalidDelay, "exactly one"),
    ProducerCase("due naive datetime", park(due=datetime(2031, 1, 1)), InvalidDelay, "timezone-aware"),
    ProducerCase("due a date", park(due=date(2031, 1, 1)), InvalidDelay, "must be a datetime, got date"),
    ProducerCase("due an epoch number", park(due=1_900_000_000), InvalidDelay, "must be a datetime, got int"),
    ProducerCase(
        "due aware past 2248",
        park(due=datetime(2300, 1, 1, tzinfo=timezone.utc)),
        InvalidDelay,
        "latest supported",
    ),
    ProducerCase("due aware in another zone", park(due=AWARE_PLUS_5), None, accepted=check_aware_due),
    ProducerCase(
        "due aware in the past",
        park(due=datetime(2001, 1, 1, tzinfo=timezone.utc)),
        None,
        accepted=check_past_due_is_due_now,
    ),
    ProducerCase(
        "payload over the limit",
        park(envelope=Envelope(route="ready", payload=b"x" * 1025), delay=1),
        PayloadTooLarge,
        "1025 bytes, over the limit of 1024",
    ),
    ProducerCase(
        "payload not bytes",
        park(envelope=Envelope(route="ready", payload="text"), delay=1),  # type: ignore[arg-type]
        InvalidMessage,
        "payload must be bytes, got str",
    ),
    ProducerCase("id empty", park(id="", delay=1), InvalidMessage, "1 to 512 characters"),
    ProducerCase("id too long", park(id="x" * 513, delay=1), InvalidMessage, "1 to 512 characters, got 513"),
    ProducerCase("id not a string", park(id=7, delay=1), InvalidMessage, "must be a string, got int"),  # type: ignore[arg-type]
    ProducerCase(
        "one bad request in park_many",
        lambda store: store.park_many(
            [ParkRequest("m", Envelope(route="ready", payload=b"m"), delay=1), ParkRequest("n", GOOD, delay=math.nan)]
        ),
        InvalidDelay,
        "NaN",
    ),
    ProducerCase("on_conflict unknown", park(delay=1, on_conflict="merge"), ValueError, "'replace' or 'keep'"),
    ProducerCase("reschedule NaN", lambda store: store.reschedule("m", delay=math.nan), InvalidDelay, "NaN"),
    ProducerCase(
        "reschedule naive", lambda store: store.reschedule("m", due=datetime(2031, 1, 1)), InvalidDelay, "aware"
    ),
]


@pytest.mark.parametrize("case", PRODUCER_CASES, ids=[case.name for case in PRODUCER_CASES])
def test_producer_input(world: World, case: ProducerCase) -> None:
    before = world.store.stats()
    if case.error is None:
        result = case.call(world.store)
        assert case.accepted is not None
        case.accepted(world, result)
        outcome = "accepted as documented"
    else:
        with pytest.raises(case.error, match=case.match) as raised:
            case.call(world.store)
        assert world.store.get("m") is None, "nothing is written when the input is refused"
        assert world.store.stats().counters == before.counters
        outcome = f"{type(raised.value).__name__}: {raised.value}"
    world.assert_still_promoting()
    print(f"[{case.name}] {outcome[:150]}")


def test_redis_unreachable_at_send_time(world: World) -> None:
    """The caller gets StoreUnavailable at once; nothing is dropped silently; the running promoter goes on."""
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.5)
    other = DelayStore(unreachable, namespace=world.keys.namespace)
    with pytest.raises(StoreUnavailable, match="Redis unavailable during park") as raised:
        other.park("m", GOOD, delay=0)
    with pytest.raises(StoreUnavailable):
        other.park_many([ParkRequest(f"m{n}", GOOD, delay=0) for n in range(3)])
    assert world.store.get("m") is None
    world.assert_still_promoting()
    print(f"[Redis unreachable at send time] StoreUnavailable: {raised.value}")


# -- records planted in Redis -----------------------------------------------------------------------------------


def header(**fields: Any) -> bytes:
    return json.dumps({"v": 1, "f": "raw", "r": "ready", **fields}).encode()


PLANTED_CASES: list[tuple[str, bytes | None, str]] = [
    ("malformed JSON", b'{"v":1,"f":"raw","r":"ready"\npayload', "not"),
    ("truncated inside the header", b'{"v":1,"f":"raw","r":"rea', "no header line"),
    ("truncated header with newline", b'{"v":1,"f":"raw","r":"rea\n', "not"),
    ("empty envelope", b"", "no header line"),
    ("binary garbage", bytes(range(256)) * 4, "not"),
    ("header is a JSON array", b'["ready"]\npayload', "not a JSON object"),
    ("header nested 100k deep", b"[" * 100_000 + b"\npayload", "malformed envelope"),
    ("member with no payload", None, "missing payload"),
    ("unknown route", header(r="somewhere-else") + b"\npayload", "unknown route"),
    ("route not a string", header(r=["ready"]) + b"\npayload", "no route"),
    ("no route", b'{"v":1,"f":"raw"}\npayload', "no route"),
    ("unsupported version", header(v=99) + b"\npayload", "unsupported envelope version 99"),
    ("hash route without a hash field", header(r="hashed") + b"\npayload", "no hash field"),
    ("binary header cut short", b"\x02\x00\x00", "truncated header"),
    ("binary header cut in its route", b"\x02\x00" + bytes(6) + b"\x03raw\x00\x09rea", "truncated header"),
    ("binary header, unknown route", Envelope(route="somewhere-else", payload=b"p").encode(), "unknown route"),
    ("binary header, hash route without its field", Envelope(route="hashed", payload=b"p").encode(), "no hash field"),
    # JSON cannot write an infinite version back: a reason built with cjson.encode failed the whole script after
    # it had taken the batch, and every message of it was lost.
    ("version too large for a double", b'{"v":1e999,"f":"raw","r":"ready"}\npayload', "unsupported envelope version"),
    ("version true", b'{"v":true,"f":"raw","r":"ready"}\npayload', "unsupported envelope version"),
    ("header after a byte-order mark", b'\xef\xbb\xbf{"v":1,"f":"raw","r":"ready"}\npayload', "header is not"),
    (
        "binary header with flags of a later format",
        b"\x02\x30" + Envelope(route="ready", payload=b"p").encode()[2:],
        "unknown flags 0x30",
    ),
    (
        "binary header, name not UTF-8",
        b"\x02\x01" + bytes(6) + b"\x03raw\x00\x05ready\x00\x02\xff\xfepayload",
        "name is not UTF-8",
    ),
    (
        "binary header, extras a JSON array",
        b"\x02\x08" + bytes(6) + b"\x03raw\x00\x05ready\x00\x00\x00\x02[]payload",
        "extras are not",
    ),
]


@pytest.mark.parametrize(("name", "raw", "reason"), PLANTED_CASES, ids=[case[0] for case in PLANTED_CASES])
def test_planted_record_is_dead_lettered_with_a_reason(world_on_path: World, path: str, name: str, raw, reason):
    world = world_on_path
    # Good messages due in the same batch as the bad one must not suffer from it.
    world.store.park_many([ParkRequest(f"ok-{n}", Envelope(route="ready", payload=b"ok"), delay=0) for n in range(5)])
    world.plant("bad", raw)
    wait_for(lambda: world.store.stats().dead == 1, what="the planted record dead-lettered")
    info = world.store.get("bad")
    assert info is not None and info.state == "dead"
    assert info.error is not None and reason in info.error, info.error
    wait_for(lambda: world.delivered().count(b"ok") == 5, what="the good messages of the same batch delivered")
    if raw:
        assert info.raw == raw, "the corrupt record is kept for inspection"
    assert world.promoter.counters.errors == 0
    assert world.promoter.counters.dead_lettered == 1, "counted (and logged) by the promoter, on either path"
    world.assert_still_promoting()
    stats = world.store.stats()
    assert (stats.parked, stats.inflight) == (0, 0)
    print(f"[{name}, {path}] dead-lettered: {info.error[:120]}")


def test_an_id_that_is_not_utf8_does_not_hold_up_its_batch(world_on_path: World, path: str) -> None:
    # delay_broker parks text ids; a foreign writer's bytes must cost only their own message.
    world = world_on_path
    world.store.park_many([ParkRequest(f"ok-{n}", Envelope(route="ready", payload=b"ok"), delay=0) for n in range(5)])
    world.plant(b"bad-\xff", Envelope(route="ready", payload=b"odd id").encode(parked_at_ms=1))  # type: ignore[arg-type]
    wait_for(lambda: world.delivered().count(b"ok") == 5, what="the good messages of the same batch delivered")
    if path == "exactly-once":  # handed over inside Redis: the id is never read as text
        wait_for(lambda: b"odd id" in world.delivered(), what="the odd id's message delivered")
    else:
        wait_for(lambda: world.store.stats().dead == 1, what="the odd id dead-lettered")
        [info] = world.store.list_messages("dead")
        assert info.id == "bad-\\xff" and info.error == "malformed id: not UTF-8", (info.id, info.error)
    assert world.promoter.counters.errors == 0
    world.assert_still_promoting()


def test_a_due_score_of_minus_infinity_is_promoted_with_its_batch(world_on_path: World, path: str) -> None:
    # Only a hand-made ZADD writes one: it is due (before everything), and it must not hold up its batch. Every
    # claim that met it used to raise after leasing the batch, until all of it was dead-lettered.
    world = world_on_path
    world.store.park_many([ParkRequest(f"ok-{n}", Envelope(route="ready", payload=b"ok"), delay=0) for n in range(5)])
    world.client.hset(world.keys.msg, "minus-inf", Envelope(route="ready", payload=b"odd score").encode(parked_at_ms=1))
    world.client.zadd(world.keys.due, {"minus-inf": float("-inf")})
    world.store.list_messages("due")  # listed as due at the epoch, if not yet promoted: no error either way
    wait_for(lambda: world.delivered().count(b"ok") == 5, what="the good messages of the same batch delivered")
    wait_for(lambda: b"odd score" in world.delivered(), what="the message with the odd score delivered")
    assert world.store.stats().dead == 0 and world.promoter.counters.errors == 0
    world.assert_still_promoting()


@pytest.mark.parametrize("spoiled", ["attempts", "leased", "leased nan"])
def test_a_spoiled_lease_record_is_dead_lettered_and_its_batch_delivered(redis_server: EmbeddedRedis, spoiled: str):
    # A lease that ran out, its attempts count or due score not a number: giving it back used to fail half-way
    # (the message in no set at all) or refuse every claim of the shard.
    worlds = make_world(redis_server, "at-least-once")
    world = next(worlds)
    try:
        now_ms = int(world.client.time()[0]) * 1000
        world.client.hset(world.keys.msg, "victim", Envelope(route="ready", payload=b"victim").encode(parked_at_ms=1))
        leased = {"leased": "not a score", "leased nan": "nan"}.get(spoiled, (now_ms - 5000) * 1024)
        world.client.hset(world.keys.leased, "victim", leased)
        world.client.hset(world.keys.attempts, "victim", "garbage" if spoiled == "attempts" else 1)
        world.client.zadd(world.keys.inflight, {"victim": now_ms - 1000})
        world.store.park_many(
            [ParkRequest(f"ok-{n}", Envelope(route="ready", payload=b"ok"), delay=0) for n in range(50)]
        )
        wait_for(lambda: world.delivered().count(b"ok") == 50, what="the good messages delivered")
        wait_for(lambda: world.store.stats().dead == 1, what="the victim dead-lettered")
        info = world.store.get("victim")
        assert info is not None and info.state == "dead" and info.error is not None
        assert info.error.startswith("malformed"), info.error
        assert info.raw is not None, "its envelope is kept for inspection"
        assert world.promoter.counters.errors == 0
        world.assert_still_promoting()
    finally:
        worlds.close()


def test_records_of_the_json_format_are_still_promoted(world_on_path: World, path: str) -> None:
    # Records parked by releases before the binary header (and by record_version=1) are read as they were.
    world = world_on_path
    earlier = Envelope(route="ready", payload=b"from an earlier release", framework="raw", name="legacy")
    world.plant("legacy", earlier.encode(parked_at_ms=1, version=1))
    wait_for(lambda: b"from an earlier release" in world.delivered(), what="the JSON-format record delivered")
    assert world.store.stats().dead == 0
    world.assert_still_promoting()


def test_json_headers_read_alike_on_both_paths(world_on_path: World) -> None:
    # Valid JSON that the scripts' cjson reads as integers and an empty object: the exactly-once script took
    # these while the at-least-once path, decoding in Python, dead-lettered them.
    world = world_on_path
    odd = [b'"t":1.0', b'"t":17e11', b'"x":[]']
    for n, field in enumerate(odd):
        world.plant(f"odd-{n}", b'{"v":1,"f":"raw","r":"ready",' + field + b"}\n" + field)
    wait_for(lambda: set(odd) <= set(world.delivered()), what="the three records delivered")
    assert world.store.stats().dead == 0


# -- keys of the wrong type -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrongTypeCase:
    name: str
    key: Callable[[World], str]
    spoil: Callable[[redis.Redis, str], object]
    park_refused: bool
    """Whether park() of a new id refuses while the key is spoiled (it writes that key)."""
    blocks: tuple[str, ...] = ("exactly-once", "at-least-once")
    """The promotion paths that use the key, and so stop (and back off) while it is spoiled."""


def as_string(client: redis.Redis, key: str) -> object:
    return client.set(key, "not what you think")


def as_list(client: redis.Redis, key: str) -> object:
    return client.rpush(key, "x")


def counter_not_an_integer(client: redis.Redis, key: str) -> object:
    return client.hset(key, "parked", "not a number")


WRONG_TYPE_CASES = [
    WrongTypeCase("msg is a string", lambda w: w.keys.msg, as_string, True),
    WrongTypeCase("due is a string", lambda w: w.keys.due, as_string, True),
    WrongTypeCase("dead is a list", lambda w: w.keys.dead, as_list, True),
    WrongTypeCase("stats is a list", lambda w: w.keys.stats, as_list, True),
    WrongTypeCase("errors is a string", lambda w: w.keys.errors, as_string, False),
    WrongTypeCase("promoters is a string", lambda w: w.keys.promoters, as_string, False),
    WrongTypeCase("wake is a string", lambda w: w.keys.wake, as_string, True),
    WrongTypeCase("parked counter is not an integer", lambda w: w.keys.stats, counter_not_an_integer, True, blocks=()),
    WrongTypeCase("target list is a string", lambda w: w.ready, as_string, False),
]


@pytest.mark.parametrize("case", WRONG_TYPE_CASES, ids=[case.name for case in WRONG_TYPE_CASES])
def test_key_of_the_wrong_type(world_on_path: World, path: str, case: WrongTypeCase) -> None:
    world = world_on_path
    key = case.key(world)
    parked = [f"w{n}" for n in range(5)]
    world.store.park_many([ParkRequest(id, Envelope(route="ready", payload=id.encode()), delay=1.0) for id in parked])
    # Saved and spoiled in one step, well before the messages are due: a promoter acting in between would
    # make the saved copy stale.
    spoiling = world.client.pipeline(transaction=True)
    spoiling.dump(key)
    spoiling.delete(key)
    case.spoil(spoiling, key)
    saved = spoiling.execute()[0]
    errors_before = world.promoter.counters.errors

    if case.park_refused:
        with pytest.raises(DelayBrokerError) as raised:
            world.store.park("refused", GOOD, delay=0)
        message = str(raised.value)
        assert key in message and ("WRONGTYPE" in message or "not an integer" in message), message
    time.sleep(1.3)  # the parked messages come due while the key is spoiled
    if path in case.blocks:
        wait_for(lambda: world.promoter.counters.errors > errors_before + 1, what="the promoter backing off")
    spoiled_type = case.spoil != counter_not_an_integer
    if spoiled_type and key in (world.keys.due, world.keys.dead, world.keys.stats, world.keys.promoters):
        with pytest.raises(DelayBrokerError, match="WRONGTYPE key " + re.escape(key)):
            world.store.stats()
    assert world.promoter.running, "the promoter must log and back off, not die"

    # Fixed: the original value is put back, and everything parked before is delivered; nothing was lost. In
    # one step: a claim between a DEL and a RESTORE of the envelopes would find none (and dead-letter them).
    if saved is not None:
        world.client.restore(key, 0, saved, replace=True)
    else:
        world.client.delete(key)
    wait_for(lambda: {id.encode() for id in parked} <= set(world.delivered()), what="the parked messages delivered")
    world.assert_still_promoting(timeout=30)
    stats = world.store.stats()
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)
    delivered = world.delivered()
    assert all(delivered.count(id.encode()) == 1 for id in parked), "each delivered once"
    failures = world.promoter.counters.errors - errors_before
    print(f"[{case.name}, {path}] {failures} failed cycles while spoiled, then 5/5 delivered, 0 lost, 0 duplicated")
