"""Pack bookkeeping that fails loudly: damage planted by hand (what an operator's redis-cli can do) is refused
before anything is written, or found when the pack is opened, counted, logged with its key and dead-lettered
when it can be read; never lost in silence."""

from __future__ import annotations

import logging
import uuid

import pytest

from delay_broker import DelayStore, Envelope, InvalidMessage, StoreDamaged
from delay_broker.packing import IndexShape, binary_id

HOUR = 3600


def new_id() -> str:
    return str(uuid.uuid4())


def envelope(payload: bytes = b"payload") -> Envelope:
    return Envelope(route="ready", payload=payload, framework="dramatiq", name="task")


def pack_of(store: DelayStore) -> str:
    [name] = [name.decode() for name in store.client.zrange(store.keys.packs, 0, -1)]
    return name


def opener_of(store: DelayStore) -> DelayStore:
    """A store whose promoters open every pack now (its lead longer than any delay)."""
    return DelayStore(store.client, namespace=store.keys.namespace, pack_after=10 * 365 * 86400)


def open_everything(store: DelayStore) -> None:
    opener = opener_of(store)
    opener.open_packs(0, calls=1000)


def held_copies(store: DelayStore, id: str) -> int:
    """Copies of ``id`` in the ordinary layout and in packs (found by their records)."""
    client = store.client
    copies = int(client.zscore(store.keys.due, id) is not None)
    for key in client.scan_iter(match=store.keys.key("pack:*")):
        copies += sum(record[:16] == binary_id(id) for record in client.lrange(key, 0, -1))
    return copies


def damaged(store: DelayStore) -> int:
    return store.stats().counters.get("pack_damaged", 0)


@pytest.mark.parametrize("field", ["pack_live", "pack_base"])
def test_a_malformed_pack_count_is_refused_before_anything_is_written(store: DelayStore, field: str) -> None:
    """Before: with pack_live 'x', reschedule lost the message, cancel raised after cancelling and park raised
    after storing a second copy (a retrying producer then had two)."""
    id = new_id()
    store.park(id, envelope(b"first"), delay=HOUR)
    name = pack_of(store)
    key = getattr(store.keys, field)
    kept = store.client.hget(key, name)
    store.client.hset(key, name, "x")
    for attempt in (
        lambda: store.reschedule(id, delay=2 * HOUR),
        lambda: store.cancel(id),
        lambda: store.park(id, envelope(b"second"), delay=HOUR),
    ):
        with pytest.raises(StoreDamaged, match=f"{name} has a malformed .* in {key}.*delay-broker check"):
            attempt()
        assert held_copies(store, id) == 1
    store.client.hset(key, name, kept or 0)  # mended
    info = store.get(id)
    assert info is not None and info.envelope is not None and info.envelope.payload == b"first"


def test_a_new_message_for_a_damaged_pack_takes_the_ordinary_layout(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.park(new_id(), envelope(), delay=HOUR)
    name = pack_of(store)
    store.client.hset(store.keys.pack_live, name, "x")
    id = new_id()
    with caplog.at_level(logging.WARNING, "delay_broker.store"):
        assert store.park(id, envelope(b"new"), delay=HOUR).outcome == "new"
    assert store.client.zscore(store.keys.due, id) is not None, "parked, in the ordinary layout"
    assert store.keys.pack(name) in caplog.text and "delay-broker check" in caplog.text
    assert damaged(store) == 1


def test_a_deleted_pack_list_is_counted_and_logged_when_opened(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(3):
        store.park(new_id(), envelope(), delay=HOUR)
    name = pack_of(store)
    store.client.delete(store.keys.pack(name))
    with caplog.at_level(logging.ERROR, "delay_broker.store"):
        open_everything(store)
    assert "3 message(s) counted in it were not found" in caplog.text and store.keys.pack(name) in caplog.text
    assert damaged(store) == 3
    assert store.client.zcard(store.keys.packs) == 0 and store.stats().packed == 0


def test_records_whose_index_is_gone_are_dead_lettered_with_the_reason(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [new_id() for _ in range(5)]
    for id in ids:
        store.park(id, envelope(id.encode()), delay=HOUR)
    for key in store.client.scan_iter(match=store.keys.key("packed:*")):
        store.client.delete(key)
    with caplog.at_level(logging.ERROR, "delay_broker.store"):
        open_everything(store)
    dead = {info.id: info for info in store.list_messages("dead")}
    assert set(dead) == set(ids), "each readable record dead-lettered, not dropped"
    assert all("without its index entry" in (info.error or "") for info in dead.values())
    assert dead[ids[0]].envelope is not None and dead[ids[0]].envelope.payload == ids[0].encode()
    assert "5 record(s) without their index entry" in caplog.text and damaged(store) == 5
    requeued = store.requeue_dead(ids[:1])
    assert requeued.count == 1 and store.get(ids[0]) is not None and store.get(ids[0]).state == "due"


def test_an_index_entry_past_the_end_of_its_pack_dead_letters_the_record(store: DelayStore) -> None:
    ids = [new_id() for _ in range(3)]
    for id in ids:
        store.park(id, envelope(), delay=HOUR)
    name = pack_of(store)
    shape = IndexShape.parse((store.client.get(store.keys.packed_shape) or b"0:0").decode())
    partition = store.keys.packed(shape.partition(binary_id(ids[1])))
    width, slot = map(int, name.split(":"))
    store.client.hset(
        partition, binary_id(ids[1]), width.to_bytes(4, "big") + slot.to_bytes(4, "big") + bytes([0, 0, 0, 99])
    )
    open_everything(store)
    assert [info.id for info in store.list_messages("dead")] == [ids[1]]
    assert {info.id for info in store.list_messages()} == {ids[0], ids[2]}
    assert damaged(store) == 1


def test_a_malformed_shape_is_refused_and_the_pack_waits_for_a_repair(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    id = new_id()
    store.park(id, envelope(), delay=HOUR)
    store.client.set(store.keys.packed_shape, "garbage")
    with pytest.raises(StoreDamaged, match="packed index shape"):
        store.get(id)
    with caplog.at_level(logging.ERROR, "delay_broker.store"):
        open_everything(store)
    assert "is not opened" in caplog.text and "packed index shape" in caplog.text
    assert store.client.zcard(store.keys.packs) == 1, "nothing lost: waits for the repair"
    store.client.delete(store.keys.packed_shape)
    open_everything(store)
    assert store.client.zscore(store.keys.due, id) is not None


def test_a_pack_whose_listing_was_deleted_is_counted_listed_again_and_opened(
    store: DelayStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: deleting PACKS left every record in Redis for ever, never opened, while stats said 0."""
    ids = [new_id() for _ in range(4)]
    for id in ids:
        store.park(id, envelope(), delay=HOUR)
    store.client.delete(store.keys.packs)
    assert store.stats().packed == 4 and store.stats().parked == 4
    with caplog.at_level(logging.ERROR, "delay_broker.store"):
        open_everything(store)
    assert "did not list them" in caplog.text
    assert {info.id for info in store.list_messages()} == set(ids)
    assert store.client.zcard(store.keys.due) == 4 and damaged(store) == 1


def test_an_id_utf8_cannot_encode_is_an_invalid_message(store: DelayStore) -> None:
    with pytest.raises(InvalidMessage, match="UTF-8"):
        store.park("lone-\udc80", envelope(), delay=1)
    with pytest.raises(InvalidMessage, match="UTF-8"):
        store.cancel("lone-\ud800")
