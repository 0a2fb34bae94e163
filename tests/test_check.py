"""``delay-broker check`` and ``--repair`` against a real redis-server: a clean store reports nothing and is left
byte for byte as it was; each kind of damage, planted by hand as an operator's redis-cli could, is found (exit
1), mended (exit 0), gone on the next check, and every message that was readable is then promoted exactly
once; a repair that races an open or a park of the same pack changes nothing that moved."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from click.testing import CliRunner, Result

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest
from delay_broker.cli import cli
from delay_broker.embedded import EmbeddedRedis
from delay_broker.packing import IndexShape, binary_id
from delay_broker.store import check_read
from delay_broker.store.checking import check_store, mend, repair_store

HOUR = 3600
LONG_LEAD = 10 * 365 * 86400
"""A ``pack_after`` whose lead (half of it) opens every pack now."""
DOCS = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


class Damage(NamedTuple):
    """What a plant did: the kinds of finding it makes, the messages it made unreadable (gone with their records),
    and how many messages the repair writes off as lost."""

    kinds: set[str]
    unreadable: frozenset[str] = frozenset()
    written_off: int = 0


Plant = Callable[[DelayStore, list[str]], Damage]


def new_id() -> str:
    return str(uuid.uuid4())


def envelope(id: str) -> Envelope:
    """A message whose payload is its id: what a promotion delivers says which message it was."""
    return Envelope(route="ready", payload=id.encode(), framework="dramatiq", name="task")


def park_packed(store: DelayStore, count: int = 300) -> list[str]:
    """``count`` messages packed into two packs (an hour ahead, and ten minutes later), enough to split the
    packed index into several partitions."""
    ids = [new_id() for _ in range(count)]
    requests = [ParkRequest(id, envelope(id), delay=HOUR + 600 * (n % 2)) for n, id in enumerate(ids)]
    for start in range(0, count, 100):
        store.park_many(requests[start : start + 100])
    assert store.stats().packed == count
    return ids


def namespace_keys(store: DelayStore) -> list[bytes]:
    client = store.client
    return sorted(key for space in store.shards for key in client.scan_iter(match=space.pattern, count=1000))


def dumps(store: DelayStore) -> dict[bytes, bytes]:
    return {key: store.client.dump(key) for key in namespace_keys(store)}  # type: ignore[misc]


def packs(store: DelayStore, shard: int = 0) -> list[str]:
    return [name.decode() for name in store.client.zrange(store.shards[shard].packs, 0, -1)]


def shape(store: DelayStore, shard: int = 0) -> IndexShape:
    return IndexShape.parse((store.client.get(store.shards[shard].packed_shape) or b"0:0").decode())


def partition(store: DelayStore, id: str, shard: int = 0) -> str:
    return store.shards[shard].packed(shape(store, shard).partition(binary_id(id)))


def record_of(store: DelayStore, id: str) -> tuple[str, bytes]:
    """The pack key holding ``id``'s record, and the record."""
    for name in packs(store):
        key = store.keys.pack(name)
        for record in store.client.lrange(key, 0, -1):
            if record[:16] == binary_id(id):
                return key, record
    raise AssertionError(f"no record of {id}")


def ids_in(store: DelayStore, name: str) -> set[str]:
    records = store.client.lrange(store.keys.pack(name), 0, -1)
    return {str(uuid.UUID(bytes=record[:16])) for record in records if len(record) >= 16}


def run_check(server: EmbeddedRedis, namespace: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["check", *args, "--redis-url", server.url, "--namespace", namespace])


def kinds_of(result: Result, part: str | None = None) -> set[str]:
    data = json.loads(result.output)
    report = data[part] if part else data
    return {finding["kind"] for shard in report["shards"] for finding in shard["findings"]}


def promote_everything(store: DelayStore, target: str) -> Counter[str]:
    """Open every pack (with a store whose lead covers them), make every parked message due now, promote them
    all into ``target``: how many times each message (its payload) arrived."""
    opener = DelayStore(store.client, namespace=store.keys.namespace, pack_after=LONG_LEAD)
    for shard in range(len(store.shards)):
        opener.open_packs(shard, calls=10_000)
        assert not packs(store, shard), "every pack opened"
        for raw in store.client.zrange(store.shards[shard].due, 0, -1):
            store.reschedule(raw.decode(), delay=0)
        while store.promote_direct({"ready": ListTarget(target)}, 1000, "check-test", shard=shard).promoted:
            pass
    return Counter(payload.decode() for payload in store.client.lrange(target, 0, -1))


def assert_each_promoted_once(store: DelayStore, target: str, ids: set[str]) -> None:
    promoted = promote_everything(store, target)
    assert promoted == Counter(ids), "every readable message promoted exactly once, no other"
    stats = store.stats()
    assert stats.dead == 0 and stats.parked == 0 and stats.packed == 0


# -- a clean store -------------------------------------------------------------------------------------------------


def test_a_clean_store_reports_nothing_and_the_check_changes_no_key(
    store: DelayStore, redis_server: EmbeddedRedis, namespace: str
) -> None:
    park_packed(store, 300)
    store.park("ordinary-soon", envelope("ordinary-soon"), delay=60)  # within pack_after: the ordinary layout
    store.park("not-a-uuid", envelope("not-a-uuid"), delay=HOUR)  # never packed
    for id in ("dead-1", "inflight-1"):
        store.park(id, envelope(id), delay=0)
    claim = store.claim(10, 60, "check-test")
    store.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages if m.id == "dead-1"])
    assert store.stats().dead == 1 and store.stats().inflight == 1
    opener = DelayStore(store.client, namespace=namespace, pack_after=LONG_LEAD)
    opener.open_packs(0, calls=1)  # one chunk of a pack opened: a pack with a base
    before = dumps(store)

    report = check_store(store)
    assert not report.damaged and report.unconfirmed == 0
    [shard] = report.shards
    assert shard.packs == 2 and shard.records == 200 and shard.entries == 200
    result = run_check(redis_server, namespace)
    assert result.exit_code == 0, result.output
    assert "nothing wrong" in result.output and "No damage found" in result.output
    result = run_check(redis_server, namespace, "--json")
    assert result.exit_code == 0 and json.loads(result.output)["damaged"] is False

    assert dumps(store) == before, "the read-only check changed no key"


# -- each kind of damage -------------------------------------------------------------------------------------------


def plant_shape(store: DelayStore, ids: list[str]) -> Damage:
    assert shape(store).partitions > 1
    store.client.set(store.keys.packed_shape, "garbage")
    return Damage({"shape_malformed"})


def plant_misplaced(store: DelayStore, ids: list[str]) -> Damage:
    count = shape(store).partitions
    for id in ids[:5]:
        own = partition(store, id)
        value = store.client.hget(own, binary_id(id))
        store.client.hdel(own, binary_id(id))
        number = int(own.rsplit(":", 1)[1])
        store.client.hset(store.keys.packed((number + 1) % count), binary_id(id), value)  # type: ignore[arg-type]
    return Damage({"entry_misplaced"})


def plant_past_end(store: DelayStore, ids: list[str]) -> Damage:
    key = partition(store, ids[1])
    value = store.client.hget(key, binary_id(ids[1]))
    assert value is not None
    store.client.hset(key, binary_id(ids[1]), value[:8] + (99_999).to_bytes(4, "big"))
    return Damage({"entry_broken"})


def plant_entry_without_record(store: DelayStore, ids: list[str]) -> Damage:
    ghost = new_id()
    value = store.client.hget(partition(store, ids[0]), binary_id(ids[0]))
    store.client.hset(partition(store, ghost), binary_id(ghost), value)  # type: ignore[arg-type]
    return Damage({"entry_broken"}, written_off=1)


def plant_list_deleted(store: DelayStore, ids: list[str]) -> Damage:
    name = packs(store)[1]
    lost = ids_in(store, name)
    store.client.delete(store.keys.pack(name))
    return Damage({"entry_broken", "pack_gone"}, frozenset(lost), len(lost))


def plant_partitions_deleted(store: DelayStore, ids: list[str]) -> Damage:
    for key in store.client.scan_iter(match=store.keys.key("packed:*")):
        store.client.delete(key)
    return Damage({"record_orphaned"})


def plant_duplicate(store: DelayStore, ids: list[str]) -> Damage:
    key, record = record_of(store, ids[0])
    store.client.rpush(key, record)
    return Damage({"record_duplicate"})


def plant_copy_of_a_message_held_elsewhere(store: DelayStore, ids: list[str]) -> Damage:
    key, record = record_of(store, ids[0])
    store.cancel(ids[0])
    store.park(ids[0], envelope(ids[0]), delay=60)  # parked again, in the ordinary layout
    store.client.rpush(key, record)
    return Damage({"record_duplicate"})


def plant_unreadable(store: DelayStore, ids: list[str]) -> Damage:
    store.client.rpush(store.keys.pack(packs(store)[0]), b"junk")
    return Damage({"record_unreadable"})


def plant_count(value: str | int) -> Plant:
    def plant(store: DelayStore, ids: list[str]) -> Damage:
        name = packs(store)[0]
        live = int(store.client.hget(store.keys.pack_live, name) or 0)
        store.client.hset(store.keys.pack_live, name, live + value if isinstance(value, int) else value)
        return Damage({"count_drift"})

    return plant


def plant_base(value: str | int) -> Plant:
    def plant(store: DelayStore, ids: list[str]) -> Damage:
        store.client.hset(store.keys.pack_base, packs(store)[0], value)
        return Damage({"base_drift"})

    return plant


def plant_unlisted(store: DelayStore, ids: list[str]) -> Damage:
    store.client.delete(store.keys.packs)
    return Damage({"pack_unlisted"})


def plant_late(store: DelayStore, ids: list[str]) -> Damage:
    name = packs(store)[0]
    earliest = int(store.client.zscore(store.keys.packs, name) or 0)
    store.client.zadd(store.keys.packs, {name: earliest + 600_000})
    return Damage({"pack_late"})


def plant_leftovers(store: DelayStore, ids: list[str]) -> Damage:
    store.client.hset(store.keys.pack_base, "150000:7", 4)
    store.client.hset(store.keys.pack_live, "150000:7", 2)
    store.client.hset(store.keys.pack_live, "150000:8", 0)
    return Damage({"leftover"}, written_off=2)


PLANTS: dict[str, Plant] = {
    "malformed shape": plant_shape,
    "entries in the wrong partition": plant_misplaced,
    "an entry past the end of its pack": plant_past_end,
    "an entry of an id with no record": plant_entry_without_record,
    "a pack list deleted": plant_list_deleted,
    "the index partitions deleted": plant_partitions_deleted,
    "a stale copy of a record": plant_duplicate,
    "a copy of a message held elsewhere": plant_copy_of_a_message_held_elsewhere,
    "a record too short": plant_unreadable,
    "a malformed count": plant_count("x"),
    "a count too low": plant_count(-140),
    "a count too high": plant_count(7),
    "a malformed base": plant_base("x"),
    "a drifted base": plant_base(3),
    "the list of packs deleted": plant_unlisted,
    "a pack listed late": plant_late,
    "bookkeeping of packs that are gone": plant_leftovers,
}


@pytest.mark.parametrize("plant", list(PLANTS.values()), ids=list(PLANTS))
def test_damage_is_found_mended_and_every_readable_message_promoted_once(
    store: DelayStore, redis_server: EmbeddedRedis, namespace: str, ready_key: str, plant: Plant
) -> None:
    ids = park_packed(store)
    expected, lost, written_off = plant(store, ids)

    found = run_check(redis_server, namespace, "--json")
    assert found.exit_code == 1, found.output
    assert kinds_of(found) == expected
    human = run_check(redis_server, namespace)
    assert human.exit_code == 1 and all(kind in human.output for kind in expected)

    repaired = run_check(redis_server, namespace, "--repair", "--json")
    assert repaired.exit_code == 0, repaired.output
    data = json.loads(repaired.output)
    assert set(data["repaired"]) >= expected and data["left"]["damaged"] is False
    assert data["lost"] == written_off

    again = run_check(redis_server, namespace)
    assert again.exit_code == 0 and "No damage found" in again.output, again.output
    assert_each_promoted_once(store, ready_key, set(ids) - lost)


def test_a_key_of_the_wrong_type_is_reported_and_left_to_the_operator(
    store: DelayStore, redis_server: EmbeddedRedis, namespace: str
) -> None:
    park_packed(store, 20)
    store.client.set(store.keys.pack_live, "oops")
    for args in ((), ("--repair",)):
        result = run_check(redis_server, namespace, *args)
        assert result.exit_code == 1 and "wrong_type" in result.output and "mend it by hand" in result.output


def test_usage_errors_exit_2(redis_server: EmbeddedRedis, namespace: str) -> None:
    assert run_check(redis_server, namespace, "--bogus").exit_code == 2


# -- repairs racing producers and promoters ------------------------------------------------------------------------


def copies(store: DelayStore, id: str) -> int:
    """Copies of ``id`` anywhere: the ordinary layout, dead letters, and records in packs."""
    client = store.client
    held = int(client.zscore(store.keys.due, id) is not None) + int(client.zscore(store.keys.dead, id) is not None)
    for name in packs(store):
        held += sum(record[:16] == binary_id(id) for record in client.lrange(store.keys.pack(name), 0, -1))
    return held


def test_a_repair_after_the_pack_was_opened_changes_nothing(store: DelayStore, namespace: str) -> None:
    ids = park_packed(store, 40)
    plant_partitions_deleted(store, ids)
    key, record = record_of(store, ids[0])
    store.client.rpush(key, record)  # and a stale copy
    report = check_store(store)
    assert {finding.kind for finding in report.findings} == {"record_orphaned", "record_duplicate"}
    DelayStore(store.client, namespace=namespace, pack_after=LONG_LEAD).open_packs(0, calls=100)  # dead-letters them

    once = mend(store, report)
    assert not once.repaired and sum(once.changed.values()) == len(report.findings), "changed meanwhile, all"
    assert all(copies(store, id) == 1 for id in ids), "no message duplicated"
    assert not check_store(store).damaged


def test_a_repair_after_a_park_into_the_pack_changes_nothing_it_should_not(
    store: DelayStore, ready_key: str, namespace: str
) -> None:
    ids = park_packed(store, 40)
    name = packs(store)[0]
    store.client.hset(store.keys.pack_live, name, 2)  # too low: a cancel could drop the pack with messages in it
    report = check_store(store)
    assert [finding.kind for finding in report.findings] == ["count_drift"]
    late = new_id()
    store.park(late, envelope(late), delay=HOUR)  # into the same pack: its length and count moved
    assert late in ids_in(store, name)

    once = mend(store, report)
    assert once.changed == Counter(count_drift=1) and not once.repaired
    assert store.client.hget(store.keys.pack_live, name) == b"3", "left as the park made it"
    assert repair_store(store).left.damaged is False
    assert_each_promoted_once(store, ready_key, {*ids, late})


def test_a_message_parked_again_before_its_orphan_is_indexed_is_kept_once(store: DelayStore, ready_key: str) -> None:
    ids = park_packed(store, 40)
    plant_partitions_deleted(store, ids)
    report = check_store(store)
    store.park(ids[0], envelope(ids[0]), delay=HOUR)  # a retrying producer: a new record, indexed

    once = mend(store, report)
    assert once.changed == Counter(record_orphaned=1) and once.repaired == Counter(record_orphaned=39)
    after = {finding.kind for finding in check_store(store).findings}
    # The old record is a stale copy now, and the pack's count still counts it (as it did before the park).
    assert after == {"record_duplicate", "count_drift"}
    assert repair_store(store).left.damaged is False
    assert_each_promoted_once(store, ready_key, set(ids))


def visible(store: DelayStore, name: str) -> int:
    """Records of pack ``name`` whose index entry points at them: the messages every script sees there."""
    key, count = store.keys.pack(name), 0
    base = int(store.client.hget(store.keys.pack_base, name) or 0)
    for index, record in enumerate(store.client.lrange(key, 0, -1)):
        if len(record) >= 16:
            width, slot = map(int, name.split(":"))
            here = width.to_bytes(4, "big") + slot.to_bytes(4, "big") + (base + index).to_bytes(4, "big")
            count += store.client.hget(partition(store, str(uuid.UUID(bytes=record[:16]))), record[:16]) == here
    return count


def test_no_record_is_indexed_into_a_pack_whose_count_could_not_be_raised(store: DelayStore, ready_key: str) -> None:
    ids = park_packed(store, 60)
    plant_partitions_deleted(store, ids)
    low, other = packs(store)
    store.client.hset(store.keys.pack_live, low, 1)  # too low for the 30 messages about to be indexed
    report = check_store(store)
    assert {finding.kind for finding in report.findings} == {"record_orphaned", "count_drift"}
    late = new_id()
    store.park(late, envelope(late), delay=HOUR)  # into that pack: the count fix is refused
    assert late in ids_in(store, low)

    once = mend(store, report)
    assert once.changed == Counter(count_drift=1, record_orphaned=30)
    assert once.repaired == Counter(record_orphaned=30), "the other pack's records indexed"
    assert int(store.client.hget(store.keys.pack_live, low) or 0) >= visible(store, low) == 1
    assert visible(store, other) == 30
    assert repair_store(store).left.damaged is False
    assert_each_promoted_once(store, ready_key, {*ids, late})


def test_no_base_is_set_while_the_count_could_not_be_raised(store: DelayStore, ready_key: str) -> None:
    ids = park_packed(store, 40)
    name = packs(store)[0]
    store.client.hset(store.keys.pack_base, name, 3)  # no entry of the pack points at its record now
    store.client.hset(store.keys.pack_live, name, 2)
    report = check_store(store)
    assert {finding.kind for finding in report.findings} == {"base_drift", "count_drift"}
    late = new_id()
    store.park(late, envelope(late), delay=HOUR)
    assert late in ids_in(store, name)

    once = mend(store, report)
    assert once.changed == Counter(base_drift=1, count_drift=1) and not once.repaired
    assert int(store.client.hget(store.keys.pack_live, name) or 0) >= visible(store, name) == 1
    assert repair_store(store).left.damaged is False
    assert_each_promoted_once(store, ready_key, {*ids, late})


def test_repairs_while_a_producer_parks_and_cancels_lose_and_duplicate_nothing(
    store: DelayStore, ready_key: str
) -> None:
    ids = park_packed(store, 200)
    plant_partitions_deleted(store, ids)
    store.client.hset(store.keys.pack_live, packs(store)[0], 3)
    added: list[str] = []
    cancelled: set[str] = set()
    stop = threading.Event()

    def produce() -> None:
        # Parks into both packs, and cancels: of the messages indexed by the repair meanwhile (each one found
        # takes one from its pack's count, which would drop the pack at 0 with messages still in it), and of
        # some just parked.
        n = 0
        while not stop.is_set() and n < len(ids):
            id = new_id()
            store.park(id, envelope(id), delay=HOUR + 600 * (n % 2))
            added.append(id)
            for victim in (ids[n], id) if n % 4 == 0 else (ids[n],):
                if store.cancel(victim):
                    cancelled.add(victim)
            n += 1

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        while thread.is_alive():
            repair_store(store)
    finally:
        stop.set()
        thread.join()
    assert added and repair_store(store).left.damaged is False
    assert_each_promoted_once(store, ready_key, ({*ids, *added}) - cancelled)


# -- a sharded namespace --------------------------------------------------------------------------------------------


def test_a_sharded_namespace_is_checked_and_mended_shard_by_shard(
    client: redis.Redis, redis_server: EmbeddedRedis, namespace: str, ready_key: str
) -> None:
    store = DelayStore(client, namespace=namespace, shards=3)
    ids = park_packed(store, 300)
    spaces = store.shards
    assert all(packs(store, shard) for shard in range(3))
    client.delete(spaces[0].packs)
    for key in client.scan_iter(match=spaces[1].key("packed:*")):
        client.delete(key)
    client.hset(spaces[2].pack_live, packs(store, 2)[0], "x")

    report = check_store(store)
    by_shard = {shard.shard: {finding.kind for finding in shard.findings} for shard in report.shards}
    assert by_shard == {0: {"pack_unlisted"}, 1: {"record_orphaned"}, 2: {"count_drift"}}
    assert run_check(redis_server, namespace).exit_code == 1
    result = run_check(redis_server, namespace, "--repair")
    assert result.exit_code == 0 and "No damage found" in result.output, result.output
    assert run_check(redis_server, namespace).exit_code == 0
    assert_each_promoted_once(store, ready_key, set(ids))


# -- reading in bounded pieces -------------------------------------------------------------------------------------


def test_packs_of_large_payloads_are_read_in_bounded_pieces(store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> None:
    big = 300_000
    for _ in range(12):
        id = new_id()
        store.park(id, Envelope(route="ready", payload=b"x" * big), delay=HOUR)
    replies: list[int] = []
    lrange = store.client.lrange

    def measured(key: Any, start: int, end: int) -> Any:
        records = lrange(key, start, end)
        replies.append(sum(map(len, records)))  # type: ignore[arg-type]
        return records

    monkeypatch.setattr(store.client, "lrange", measured)
    assert not check_store(store).damaged
    assert sum(replies) > 12 * big and max(replies) <= check_read.CHUNK_BYTES + big + 100


def test_a_namespace_with_glob_characters_sees_its_own_keys_only(client: redis.Redis) -> None:
    suffix = uuid.uuid4().hex[:8]
    starred = DelayStore(client, namespace=f"g*{suffix}")  # its unescaped pattern would match the other's keys
    plain = DelayStore(client, namespace=f"gz{suffix}")
    park_packed(starred, 10)
    park_packed(plain, 30)
    assert check_read.glob_escape(starred.keys.key("pack:")) == f"delay_broker:{{g\\*{suffix}}}:pack:"
    [shard] = check_store(starred).shards
    assert (shard.records, shard.entries, shard.findings) == (10, 10, [])
    plain.client.delete(plain.keys.packs)
    assert not check_store(starred).damaged and check_store(plain).damaged


# -- under the least-privilege user of docs/reliability.md ---------------------------------------------------------


def documented_acl(namespace: str) -> Iterator[list[str]]:
    """The ACL SETUSER lines docs/reliability.md gives for the store and for ``delay-broker check``, for this
    test's namespace."""
    text = DOCS.read_text()
    for line in re.findall(r"^ACL SETUSER delay_broker .*$", text, flags=re.MULTILINE):
        yield line.replace("{jobs}", "{" + namespace + "}").split()[3:]


def test_the_documented_acl_user_can_check_and_repair(
    store: DelayStore, client: redis.Redis, redis_server: EmbeddedRedis, namespace: str
) -> None:
    rules = list(documented_acl(namespace))
    assert len(rules) == 2, "the store's line and the check's"
    user = f"check-{uuid.uuid4().hex[:8]}"
    url = redis_server.url.replace("redis://", f"redis://{user}:pw@")
    base = ["check", "--redis-url", url, "--namespace", namespace]
    try:
        client.execute_command("ACL", "SETUSER", user, *(word.replace(">CHANGE-ME", ">pw") for word in rules[0]))
        refused = CliRunner().invoke(cli, base)
        assert refused.exit_code == 1 and "scan" in refused.output.lower(), "the store's list lacks SCAN"
        client.execute_command("ACL", "SETUSER", user, *rules[1])
        client.acl_log_reset()
        ids = park_packed(store, 40)
        plant_partitions_deleted(store, ids)
        found = CliRunner().invoke(cli, base)
        assert found.exit_code == 1 and "record_orphaned" in found.output, found.output
        repaired = CliRunner().invoke(cli, [*base, "--repair"])
        assert repaired.exit_code == 0, repaired.output
        assert CliRunner().invoke(cli, base).exit_code == 0
        assert client.acl_log() == [], "nothing refused"
    finally:
        client.execute_command("ACL", "DELUSER", user)
