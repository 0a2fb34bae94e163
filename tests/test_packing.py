"""Packs (delay_broker.packing): messages due far ahead kept compactly, found by id, opened in time, in order."""

from __future__ import annotations

import re
import struct
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from redis.crc import key_slot

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter, scripts
from delay_broker.clock import MAX_DUE_MS, due_to_ms
from delay_broker.deliverers import DirectLists
from delay_broker.errors import DelayBrokerError
from delay_broker.operations import MessageFilter, Operations
from delay_broker.packing import (
    MAX_WIDTH,
    MIN_WIDTH,
    NOT_PACKABLE,
    SPLIT_AT,
    IndexShape,
    Location,
    PackedElsewhere,
    binary_id,
    pack_name,
    packed_elsewhere,
)

from .helpers import wait_for

HOUR = 3600


def new_id() -> str:
    return str(uuid.uuid4())


def envelope(payload: bytes = b"payload", route: str = "ready", name: str = "task") -> Envelope:
    return Envelope(route=route, payload=payload, framework="dramatiq", name=name)


def packed_ids(store: DelayStore) -> set[str]:
    """Every id the packed index of shard 0 holds (read with SCAN: the test's own keys)."""
    found = set()
    for key in store.client.scan_iter(match=store.keys.key("packed:*")):
        found.update(str(uuid.UUID(bytes=field)) for field in store.client.hkeys(key))
    return found


def partition_of(store: DelayStore, id: str) -> str:
    """The key of the packed index partition holding ``id`` now."""
    shape = IndexShape.parse((store.client.get(store.keys.packed_shape) or b"0:0").decode())
    return store.keys.packed(shape.partition(binary_id(id)))


def in_ordinary_layout(store: DelayStore, id: str) -> bool:
    return store.client.zscore(store.keys.due, id) is not None and store.client.hexists(store.keys.msg, id)


def open_everything(store: DelayStore) -> None:
    """Open every pack now, as a promoter would once they come near (its lead made longer than any delay)."""
    opener = DelayStore(store.client, namespace=store.keys.namespace, pack_after=10 * 365 * 86400)
    for shard in range(len(store.shards)):
        assert opener.open_packs(shard, calls=1000) is None


def test_binary_ids_are_canonical_uuids_only():
    id = new_id()
    assert binary_id(id) == uuid.UUID(id).bytes
    for other in (id.upper(), id.replace("-", ""), "{" + id + "}", "order-17", "", str(uuid.UUID(int=0))):
        assert binary_id(other) == NOT_PACKABLE


def test_pack_width_grows_with_the_distance():
    now, after = 1_000_000_000, 300_000
    widths = [int(pack_name(now + d, now, after).split(":")[0]) for d in (after, 2 * after, 40 * after)]
    assert widths == [after // 16, after // 8, after * 32 // 16]
    assert pack_name(now + 3 * after, now, after) == pack_name(now + 3 * after + 1, now, after)


def test_pack_names_fit_the_index_however_far_or_near():
    """The index keeps a pack's width and slot as u32s: packs of messages years ahead are capped in width (a
    3-year delay made a pack 4.9e9 ms wide, whose index entries named another pack) and the narrowest packs
    are wide enough for the slot of any due time a store takes."""
    now = 1_800_000_000_000
    for pack_after in (10_000, 300_000, 86_400_000):
        for due in (now + pack_after, now + 3 * 365 * 86_400_000, MAX_DUE_MS):
            width, slot = map(int, pack_name(due, now, pack_after).split(":"))
            assert MIN_WIDTH <= width <= MAX_WIDTH and slot < 2**32 and slot * width <= due < (slot + 1) * width


def test_messages_parked_years_ahead_are_found_kept_rescheduled_and_opened(store):
    years = 3 * 365 * 86400
    kept, moved, cancelled = new_id(), new_id(), new_id()
    for id in (kept, moved, cancelled):
        store.park(id, envelope(id.encode()), delay=years)
    assert store.stats().packed == 3
    assert store.get(kept).envelope.payload == kept.encode()
    assert store.park(kept, envelope(b"other"), delay=years, on_conflict="keep").outcome == "kept"
    assert store.reschedule(moved, delay=years + 60) is not None
    assert store.cancel(cancelled)
    open_everything(store)
    assert {info.id: info.envelope.payload for info in store.iter_all()} == {kept: kept.encode(), moved: moved.encode()}


def test_a_message_due_far_ahead_is_packed_and_read_as_parked(store):
    id = new_id()
    result = store.park(id, envelope(b"far away"), delay=HOUR)
    assert result.outcome == "new"
    assert packed_ids(store) == {id} and not in_ordinary_layout(store, id)
    info = store.get(id)
    assert info is not None and info.state == "due" and info.due_ms == result.due_ms
    assert info.envelope is not None and info.envelope.payload == b"far away"
    stats = store.stats()
    assert (stats.parked, stats.packed, stats.overdue, stats.next_due_ms) == (1, 1, 0, result.due_ms)
    assert stats.histogram == [0, 1, 0, 0] and stats.counters == {"parked": 1}


def test_a_park_at_a_due_time_keeps_it_exactly_packed_or_not(store):
    """Celery parks at an eta (due=): the one-message scripts take it as given, as park.lua does."""
    now = datetime.now(timezone.utc)
    cases = {
        new_id(): now + timedelta(hours=1),
        "order-9": now + timedelta(hours=1),
        new_id(): now + timedelta(seconds=30),
    }
    cases[new_id()] = now - timedelta(minutes=1)  # an eta already passed: parked overdue, promoted at once
    for id, due in cases.items():
        assert store.park(id, envelope(), due=due).due_ms == due_to_ms(due)
        assert store.get(id).due_ms == due_to_ms(due)
    assert packed_ids(store) == {next(iter(cases))}
    assert store.stats().overdue == 1


def test_near_messages_and_other_ids_take_the_ordinary_layout(store):
    ids = [new_id(), "order-17", new_id().upper()]
    store.park_many(
        [ParkRequest(ids[0], envelope(), delay=60), *(ParkRequest(i, envelope(), delay=HOUR) for i in ids[1:])]
    )
    assert packed_ids(store) == set()
    assert all(in_ordinary_layout(store, id) for id in ids)


def test_a_store_without_packs_parks_none_but_reads_those_of_others(client, namespace):
    plain = DelayStore(client, namespace=namespace, pack_after=None)
    packing = DelayStore(client, namespace=namespace)
    ours, theirs = new_id(), new_id()
    plain.park(ours, envelope(), delay=HOUR)
    packing.park(theirs, envelope(b"theirs"), delay=HOUR)
    assert packed_ids(plain) == {theirs} and in_ordinary_layout(plain, ours)
    assert plain.get(theirs).envelope.payload == b"theirs"
    assert plain.cancel(theirs) and packed_ids(plain) == set()


def test_keep_reports_a_packed_message_and_replace_moves_it(store):
    id = new_id()
    first = store.park(id, envelope(b"one"), delay=HOUR)
    kept = store.park(id, envelope(b"two"), delay=2 * HOUR, on_conflict="keep")
    assert (kept.outcome, kept.due_ms) == ("kept", first.due_ms)
    assert store.get(id).envelope.payload == b"one"
    replaced = store.park(id, envelope(b"three"), delay=2 * HOUR)
    assert replaced.outcome == "replaced" and replaced.due_ms > first.due_ms
    info = store.get(id)
    assert info.envelope.payload == b"three" and info.due_ms == replaced.due_ms
    near = store.park(id, envelope(b"four"), delay=10)
    assert near.outcome == "replaced" and in_ordinary_layout(store, id) and packed_ids(store) == set()
    assert store.stats().parked == 1
    # The first pack lost its only message: it is gone, and nothing is left of the second either.
    assert store.client.zcard(store.keys.packs) == 0 and store.client.hlen(store.keys.pack_live) == 0


def test_an_ordinary_message_parked_again_far_ahead_is_packed(store):
    id = new_id()
    store.park(id, envelope(b"soon"), delay=10)
    store.park(id, envelope(b"later"), delay=HOUR)
    assert packed_ids(store) == {id} and not store.client.hexists(store.keys.msg, id)
    assert store.client.zscore(store.keys.due, id) is None
    assert store.get(id).envelope.payload == b"later"


def test_cancel_takes_packed_messages_out_and_drops_an_empty_pack(store):
    ids = [new_id() for _ in range(3)]
    store.park_many([ParkRequest(id, envelope(), delay=HOUR) for id in ids])
    assert store.cancel_each([ids[0], ids[0], "unknown"]) == [True, False, False]
    assert packed_ids(store) == set(ids[1:]) and store.get(ids[0]) is None
    assert store.stats().counters["cancelled"] == 1 and store.stats().packed == 2
    assert store.cancel_many(ids[1:]) == 2
    assert store.client.zcard(store.keys.packs) == 0 and store.client.hlen(store.keys.pack_base) == 0
    assert not [key for key in store.client.scan_iter(match=store.keys.key("pack:*"))]


def test_reschedule_moves_a_packed_message_into_the_ordinary_layout(store, client, ready_key):
    id = new_id()
    parked = store.park(id, envelope(b"x"), delay=HOUR)
    assert store.reschedule(id, delay=0) is not None
    assert in_ordinary_layout(store, id) and packed_ids(store) == set()
    Promoter(store, DirectLists({"ready": ListTarget(ready_key)})).step()
    assert client.lrange(ready_key, 0, -1) == [b"x"]
    # A rewrite read before the message was parked again is refused, packed or not.
    other = new_id()
    store.park(other, envelope(b"old"), delay=HOUR)
    read = store.get(other)
    store.park(other, envelope(b"new"), delay=HOUR)
    assert store.reschedule(other, delay=60, envelope=envelope(b"rewritten"), expected=read) is None
    assert store.reschedule(other, delay=60, envelope=envelope(b"rewritten"), expected=store.get(other))
    assert store.get(other).envelope.payload == b"rewritten" and parked.due_ms


def test_opened_packs_keep_due_times_and_order(store, client, ready_key):
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    ids = [new_id() for _ in range(1000)]  # FIFO holds for 1,024 parks of one millisecond
    store.park_many([ParkRequest(id, envelope(id.encode()), due=due) for id in ids])
    assert len(packed_ids(store)) == 1000
    open_everything(store)
    assert packed_ids(store) == set() and store.client.zcard(store.keys.due) == 1000
    assert [m.decode() for m in client.zrange(store.keys.due, 0, -1)] == ids, "FIFO for one due time"
    assert store.stats().counters["opened"] == 1000 and store.stats().packed == 0
    assert store.get(ids[0]).due_ms == due_to_ms(due)
    assert client.zcard(store.keys.packs) == 0 and client.hlen(store.keys.pack_base) == 0


def test_two_openers_of_the_same_head_move_each_record_once(store):
    ids = [new_id() for _ in range(50)]
    store.park_many([ParkRequest(id, envelope(), delay=HOUR) for id in ids])
    [name] = [n.decode() for n in store.client.zrange(store.keys.packs, 0, -1)]
    pack = store.keys.pack(name)
    base, head = store._runner.run("open_pack", 0, ["peek", name, 20, 2**20], extra=[pack], write=False)
    store._packs.open_chunk(0, name)  # another promoter takes the same head first
    shape = IndexShape.parse((store.client.get(store.keys.packed_shape) or b"0:0").decode())
    partitions = [store.keys.packed(shape.partition(head[n : n + 16])) for n in range(0, len(head), 16)]
    opened = store._runner.run("open_pack", 0, ["open", name, 20, base, head, str(shape)], extra=[pack, *partitions])
    assert opened == [-1]
    open_everything(store)
    assert store.client.zcard(store.keys.due) == 50 and store.stats().counters["opened"] == 50


def test_a_call_told_an_old_place_finds_the_message_where_it_is_now(store):
    id = new_id()
    store.park(id, envelope(b"moving"), delay=HOUR)
    before = str(Location.from_index(store.client.hget(partition_of(store, id), binary_id(id))))
    open_everything(store)
    store.park(id, envelope(b"moved"), delay=2 * HOUR)  # packed again, elsewhere
    now = str(Location.from_index(store.client.hget(partition_of(store, id), binary_id(id))))
    assert now != before
    old_pack = store.keys.pack(Location.parse(before).pack)
    shape = (store.client.get(store.keys.packed_shape) or b"0:0").decode()
    with pytest.raises(PackedElsewhere) as raised:
        key_map = struct.pack("<2H", 0, 1)  # the partition and the pack, as Runner.by_id sends them
        args = [id, shape, binary_id(id), before, key_map]
        store._runner.run("get", 0, args, extra=[partition_of(store, id), old_pack])
    assert raised.value.locations == {1: Location.parse(now)}
    pipelined = Exception(f"Command # 1 (EVALSHA) of pipeline caused error: PACKED 3 {now} 5 -")
    assert packed_elsewhere(pipelined).locations == {3: Location.parse(now), 5: None}
    assert store.get(id).envelope.payload == b"moved"


def test_listings_counts_and_selections_include_packed_messages(store):
    near = [f"near-{n}" for n in range(3)]
    far = [new_id() for _ in range(5)]
    store.park_many([ParkRequest(id, envelope(), delay=100 + n) for n, id in enumerate(near)])
    store.park_many([ParkRequest(id, envelope(name="far"), delay=HOUR + 600 * n) for n, id in enumerate(far)])
    assert [info.id for info in store.list_messages()] == near + far
    assert [info.id for info in store.list_messages(offset=2, count=2)] == [near[2], far[0]]
    assert [info.id for info in store.list_messages(start_ms=store.get(far[3]).due_ms)] == far[3:]
    assert [info.id for info in store.iter_all()] == far + near
    operations = Operations(store)
    first = operations.find(MessageFilter(), limit=4)
    second = operations.find(MessageFilter(), limit=4, cursor=first.cursor)
    assert [info.id for info in first.messages + second.messages] == near + far and second.cursor is None
    assert operations.count(MessageFilter(task="far")).matched == 5
    assert set(operations.select(MessageFilter(task="far"))) == set(far)
    assert operations.cancel(filter=MessageFilter(task="far")).done == 5 and store.stats().parked == 3


def test_a_promoter_opens_packs_in_time(client, namespace, ready_key):
    store = DelayStore(client, namespace=namespace, pack_after=10)
    id = new_id()
    parked = store.park(id, envelope(b"on time"), delay=12)
    assert packed_ids(store) == {id}
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), max_idle=1, keep_lateness=True)
    promoter.start()
    try:
        popped = client.blpop([ready_key], timeout=20)
    finally:
        promoter.stop()
    assert popped is not None and popped[1] == b"on time"
    assert store.now_ms() >= parked.due_ms and promoter.counters.lateness_ms[0] < 1000
    assert store.stats().counters["opened"] == 1


def test_a_promoter_opens_in_time_the_packs_of_a_producer_that_packs_sooner(client, namespace, ready_key):
    """A promoter looks at packs on a timer its own pack_after sets (every 37.5 s with none); a producer with a
    shorter pack_after wakes it when it makes a pack that is now the first to open (was 25 s late)."""
    producer = DelayStore(client, namespace=namespace, pack_after=10)
    promoting = DelayStore(client, namespace=namespace, pack_after=None)
    promoter = Promoter(promoting, DirectLists({"ready": ListTarget(ready_key)}), max_idle=1, keep_lateness=True)
    promoter.start()
    try:
        assert wait_for(lambda: promoter.counters.cycles > 2)  # its first look at packs is behind it
        parked = producer.park(new_id(), envelope(b"packed sooner"), delay=11)
        assert producer.stats().packed == 1
        popped = client.blpop([ready_key], timeout=30)
    finally:
        promoter.stop()
    assert popped is not None and popped[1] == b"packed sooner"
    assert producer.now_ms() >= parked.due_ms and promoter.counters.lateness_ms[0] < 1000


def test_listings_and_counts_made_while_a_pack_is_opened_show_its_messages_once(store, monkeypatch):
    now = store.now_ms()
    packed = new_id()
    store.park(packed, envelope(b"X"), delay=HOUR)
    store.park_many([ParkRequest(f"ordinary-{n}", envelope(), delay=HOUR + n) for n in range(2)])
    real_entries, real_scan = store._reading.index_entries, store.scan_index

    def opened_before_the_index_is_read(*args, **kwargs):
        open_everything(store)  # a promoter opens the pack between the packs' read and the index's
        return real_entries(*args, **kwargs)

    monkeypatch.setattr(store._reading, "index_entries", opened_before_the_index_is_read)
    assert sorted(info.id for info in store.list_messages()) == sorted([packed, "ordinary-0", "ordinary-1"])
    monkeypatch.setattr(store._reading, "index_entries", real_entries)
    store.reschedule(packed, due=datetime.fromtimestamp((now + 2 * HOUR * 1000) / 1000, timezone.utc))
    assert store.stats().packed == 1

    def opened_before_the_index_is_scanned(*args, **kwargs):
        open_everything(store)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(store, "scan_index", opened_before_the_index_is_scanned)
    assert Operations(store).count(MessageFilter()).matched == 3 == store.stats().parked


def test_a_sharded_namespace_packs_per_shard(client, namespace):
    store = DelayStore(client, namespace=namespace, shards=4)
    ids = [new_id() for _ in range(40)]
    store.park_many([ParkRequest(id, envelope(), delay=HOUR) for id in ids])
    assert store.stats().packed == 40 and {info.id for info in store.iter_all()} == set(ids)
    assert all(store.get(id) is not None for id in ids)
    open_everything(store)
    assert store.stats().packed == 0 and store.stats().parked == 40


def test_memory_per_packed_message_is_far_below_the_ordinary_layout(client, namespace):
    payload = b"p" * 250

    def cost(store: DelayStore) -> float:
        before = client.info("memory")["used_memory"]
        store.park_many([ParkRequest(new_id(), envelope(payload), delay=HOUR) for _ in range(20_000)])
        return (client.info("memory")["used_memory"] - before) / 20_000

    ordinary = cost(DelayStore(client, namespace=namespace + "-ordinary", pack_after=None))
    packed = cost(DelayStore(client, namespace=namespace + "-packed"))
    assert packed < 0.8 * ordinary, (packed, ordinary)


def test_a_corrupt_index_entry_reads_as_no_message_and_is_removed_by_a_write(store):
    id, other = new_id(), new_id()
    store.park_many([ParkRequest(id, envelope(), delay=HOUR), ParkRequest(other, envelope(), delay=HOUR)])
    partition = partition_of(store, id)
    location = store.client.hget(partition_of(store, other), binary_id(other))
    store.client.hset(partition, binary_id(id), location)  # points at the other id's record
    assert store.get(id) is None
    assert store.cancel(id) is False and not store.client.hexists(partition, binary_id(id))
    assert store.get(other) is not None


def test_unreadable_records_are_dead_lettered_or_dropped_when_opened(store):
    good, bad = new_id(), new_id()
    store.park_many([ParkRequest(good, envelope(b"good"), delay=HOUR), ParkRequest(bad, envelope(), delay=HOUR)])
    [name] = [n.decode() for n in store.client.zrange(store.keys.packs, 0, -1)]
    store.client.lset(store.keys.pack(name), 1, binary_id(bad) + b"\x01")  # its id, but no due time
    store.client.rpush(store.keys.pack(name), b"short")
    open_everything(store)
    assert store.get(good).envelope.payload == b"good"
    dead = store.get(bad)
    assert dead.state == "dead" and "no due time" in dead.error
    assert store.stats().counters["pack_unreadable"] == 1


def test_a_pack_key_of_the_wrong_type_refuses_the_park_and_changes_nothing(store):
    id = new_id()
    store.park(id, envelope(), delay=HOUR)
    [name] = [n.decode() for n in store.client.zrange(store.keys.packs, 0, -1)]
    store.client.delete(store.keys.pack(name))
    store.client.set(store.keys.pack(name), "not a list")
    with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
        store.park(new_id(), envelope(), delay=HOUR)
    with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
        store.cancel(id)
    assert store.stats().counters == {"parked": 1}


def test_duplicates_in_one_call_take_the_ordinary_layout(store):
    id = new_id()
    results = store.park_many(
        [ParkRequest(id, envelope(b"a"), delay=HOUR), ParkRequest(id, envelope(b"b"), delay=HOUR)]
    )
    assert [r.outcome for r in results] == ["new", "replaced"]
    assert in_ordinary_layout(store, id) and store.get(id).envelope.payload == b"b"


def test_a_refused_occurrence_splits_no_index(store):
    """park.lua's early answers for occurrences carry the index fields too (once read as a partition to split)."""
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    assert store.park_occurrence("nightly", new_id(), envelope(), due, revision=5).outcome == "stale"
    assert store.park_occurrence("daily", new_id(), envelope(), due).outcome == "new"
    assert store.park_occurrence("daily", new_id(), envelope(), due).outcome == "kept"
    assert store.client.get(store.keys.packed_shape) is None


def test_a_recurring_occurrence_is_packed_and_cancelled_by_a_schedule_change(store):
    occurrence = new_id()
    due = datetime.now(timezone.utc) + timedelta(days=1)
    assert store.park_occurrence("nightly", occurrence, envelope(), due).outcome == "new"
    assert packed_ids(store) == {occurrence}
    record = store.schedules()["nightly"]
    update = store.update_schedule("nightly", b"{}", revision=None, record=record, record_action="rewind",
                                   cancel=occurrence)  # fmt: skip
    assert update.done and update.cancelled and store.get(occurrence) is None


def test_every_packed_key_is_in_the_slot_of_the_shard(store):
    store.park(new_id(), envelope(), delay=HOUR)
    keys = list(store.client.scan_iter(match=store.keys.pattern))
    assert len(keys) >= 5 and {key_slot(key) for key in keys} == {key_slot(store.keys.due.encode())}


def test_the_packed_index_splits_as_it_fills_and_a_stale_shape_is_corrected(client, namespace):
    store = DelayStore(client, namespace=namespace)
    late = DelayStore(client, namespace=namespace)  # keeps the shape it saw before the splits
    first = new_id()
    late.park(first, envelope(b"first"), delay=HOUR)
    ids = [new_id() for _ in range(3000)]
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=HOUR) for id in ids])
    shape = IndexShape.parse(client.get(store.keys.packed_shape).decode())
    partitions = (1 << shape.level) + shape.split
    assert 3001 / partitions < SPLIT_AT, shape
    sizes = [client.hlen(store.keys.packed(n)) for n in range(partitions)]
    assert sum(sizes) == 3001 and max(sizes) <= 2 * SPLIT_AT
    compact = (b"listpack", b"ziplist")  # Redis 7 and 8; 6.2
    assert all(client.object("encoding", store.keys.packed(n)) in compact for n in range(partitions) if sizes[n])
    assert late.get(first).envelope.payload == b"first" and late.cancel(ids[7])
    assert late.park(ids[8], envelope(b"again"), delay=2 * HOUR).outcome == "replaced"
    assert store.get(ids[8]).envelope.payload == b"again" and store.get(ids[9]).envelope.payload == ids[9].encode()
    open_everything(late)
    assert store.stats().parked == 3000 and store.stats().packed == 0


def test_index_partitions_agree_with_lua(store):
    lib = (Path(scripts.__file__).parent / "_lib" / "packs.lua").read_text()
    assert re.search(r"local SPLIT_AT = (\d+)", lib).group(1) == str(SPLIT_AT)
    binaries = [uuid.uuid4().bytes for _ in range(200)]
    for shape in (IndexShape(0, 0), IndexShape(3, 5), IndexShape(7, 100)):
        script = "return index_partition(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))"
        source = scripts.source("split_index").split("-- split_index.lua")[0] + script
        for binary in binaries[:20]:
            assert store.client.eval(source, 0, binary, shape.level, shape.split) == shape.partition(binary)


def test_opening_a_pack_of_large_records_copies_a_bounded_number_of_bytes_per_call(store):
    """Before: one call moved 100 records whatever their size, and 100 records of 1 MiB blocked Redis for 2 s
    (another client's PING waited that long; benchmarks/bench_core.py measures that wait: pack_open_block_ms)."""
    payload = b"p" * (1024 * 1024 - 256)
    ids = [new_id() for _ in range(6)]
    store.park_many([ParkRequest(id, envelope(payload), delay=HOUR) for id in ids])
    [name] = [n.decode() for n in store.client.zrange(store.keys.packs, 0, -1)]
    opener = DelayStore(store.client, namespace=store.keys.namespace, pack_after=10 * 365 * 86400)
    opener._packs.open_chunk(0, name)
    assert store.client.zcard(store.keys.due) == 1, "one record of 1 MiB per call"
    open_everything(store)
    assert [m.decode() for m in store.client.zrange(store.keys.due, 0, -1)] == ids
    assert store.get(ids[-1]).envelope.payload == payload
