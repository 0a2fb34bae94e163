"""Property tests of the store: any sequence of operations keeps its invariants (hypothesis, real redis-server).

A model (plain Python) follows what each operation must do; after every step the Redis keys are checked
against it:

- each id is in exactly one of due / in flight / dead, or gone;
- its envelope is stored iff the id is in one of them; lease records exist iff in flight; attempts and
  errors only for ids that are there;
- ``stats()`` counts (parked, in flight, dead, overdue, histogram, counters) match the model;
- ``get()`` reports each id's state, payload and attempts as the model has them.

Due times are either "now" (delay 0) or "far" (an hour), so the model knows what a claim can take. Lease
expiry: a claim with a 1 ms lease, then a later claim past its deadline takes the expired leases back. Half the
ids are UUIDs, which a park an hour ahead packs (delay_broker.packing); the packed index must hold exactly the
packed ones, their packs count them, and opening the packs brings them into the ordinary layout unchanged.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from delay_broker import DelayStore, Envelope, ListTarget
from delay_broker.embedded import EmbeddedRedis
from delay_broker.packing import NOT_PACKABLE, Location, binary_id

IDS = [f"id-{n}" for n in range(3)] + [str(uuid.UUID(int=n + 1, version=4)) for n in range(3)]
MAX_ATTEMPTS = 3
ids = st.sampled_from(IDS)
id_lists = st.lists(ids, min_size=1, max_size=4)
actions = st.sampled_from(["retry", "dead", "release"])
TALLY: Counter[str] = Counter()
"""What the runs did, across examples (printed at the end)."""


@dataclass
class Entry:
    state: str  # "due", "inflight" or "dead"
    payload: bytes
    ready: bool = True  # due now (claimable) rather than in an hour
    deadline: int = 0  # lease deadline while in flight
    attempts: int = 0
    packed: bool = False


class StoreMachine(RuleBasedStateMachine):
    server: EmbeddedRedis

    def __init__(self) -> None:
        super().__init__()
        self.client = self.server.client()
        namespace = f"prop-{uuid.uuid4().hex[:12]}"
        self.store = DelayStore(
            self.client, namespace=namespace, max_attempts=MAX_ATTEMPTS, retry_backoff=(3600.0, 3600.0)
        )
        self.ready_key = f"{namespace}:ready"
        self.routes = {"ready": ListTarget(self.ready_key, mode="rpush")}
        self.model: dict[str, Entry] = {}
        self.counters: Counter[str] = Counter()
        self.deadlines: list[int] = [12345]
        self.version = 0

    def teardown(self) -> None:
        keys = [*self.client.scan_iter(match=self.store.keys.pattern), self.ready_key]
        self.client.delete(*keys)
        self.client.close()

    # -- helpers -----------------------------------------------------------------------------------------

    def _payload(self, id: str) -> bytes:
        self.version += 1
        return f"{id}#{self.version}".encode()

    def _held(self, id: str, deadline: int) -> bool:
        entry = self.model.get(id)
        return entry is not None and entry.state == "inflight" and entry.deadline == deadline

    def _dead_letter(self, entry: Entry) -> None:
        entry.state, entry.ready = "dead", False
        self.counters["dead_lettered"] += 1

    def _ready(self) -> set[str]:
        return {id for id, entry in self.model.items() if entry.state == "due" and entry.ready}

    def _packed(self) -> set[str]:
        return {id for id, entry in self.model.items() if entry.packed}

    @initialize(chosen=st.lists(ids, min_size=1, max_size=6, unique=True))
    def park_some_due_now(self, chosen: list[str]) -> None:
        for id in chosen:
            self.park(id, now=True, keep=False)

    # -- producers -----------------------------------------------------------------------------------------

    @rule(id=ids, now=st.booleans(), keep=st.booleans())
    def park(self, id: str, now: bool, keep: bool) -> None:
        payload = self._payload(id)
        result = self.store.park(
            id,
            Envelope(route="ready", payload=payload),
            delay=0 if now else 3600,
            on_conflict="keep" if keep else "replace",
        )
        existing = self.model.get(id)
        if existing is not None and keep:
            assert result.outcome == "kept"
            assert (result.due_ms == -1) == (existing.state != "due")
            return
        assert result.outcome == ("replaced" if existing else "new")
        if existing is not None and existing.state == "inflight":
            self.counters["promoted"] += 1  # its delivery was under way: counted as promoted by the re-park
        self.model[id] = Entry("due", payload, ready=now, packed=not now and binary_id(id) != NOT_PACKABLE)
        # A message still parked is replaced; one that came back (from a delivery or the dead) is parked again.
        self.counters["replaced" if existing is not None and existing.state == "due" else "parked"] += 1
        TALLY["parks"] += 1
        TALLY["packed parks"] += self.model[id].packed

    @rule(id=ids)
    def cancel(self, id: str) -> None:
        entry = self.model.get(id)
        expected = entry is not None and entry.state in ("due", "dead")
        assert self.store.cancel(id) is expected
        if expected:
            del self.model[id]
            self.counters["cancelled"] += 1

    @rule(id=ids, now=st.booleans())
    def reschedule(self, id: str, now: bool) -> None:
        entry = self.model.get(id)
        result = self.store.reschedule(id, delay=0 if now else 3600)
        if entry is None or entry.state != "due":
            assert result is None
        else:
            assert result is not None
            entry.ready, entry.packed = now, not now and binary_id(id) != NOT_PACKABLE

    @precondition(lambda self: any(entry.packed for entry in self.model.values()))
    @rule()
    def open_packs(self) -> None:
        """What promoters do as packed messages come near (here with a lead longer than any delay)."""
        opener = DelayStore(self.client, namespace=self.store.keys.namespace, pack_after=86400 * 365)
        assert opener.open_packs(0) is None
        opened = [entry for entry in self.model.values() if entry.packed]
        for entry in opened:
            entry.packed = False
        self.counters["opened"] += len(opened)
        TALLY["opened"] += len(opened)

    # -- promoters -----------------------------------------------------------------------------------------

    @rule(batch=st.integers(1, 4), short_lease=st.booleans(), pause=st.booleans())
    def claim(self, batch: int, short_lease: bool, pause: bool) -> None:
        if pause:
            time.sleep(0.003)  # lets 1 ms leases run out: this claim gives them back first
        claim = self.store.claim(batch, lease=0.001 if short_lease else 60.0, promoter_id="p")
        expired = sorted(
            (entry.deadline, id)
            for id, entry in self.model.items()
            if entry.state == "inflight" and entry.deadline <= claim.now_ms
        )[:batch]
        TALLY["lease expiries"] += len(expired)
        for _, id in expired:
            entry = self.model[id]
            entry.attempts += 1
            if entry.attempts >= MAX_ATTEMPTS:
                self._dead_letter(entry)
            else:
                entry.state, entry.ready = "due", True
        ready = self._ready()
        claimed = [message.id for message in claim.messages]
        assert len(claimed) == len(set(claimed)) == min(batch, len(ready))
        assert set(claimed) <= ready
        for message in claim.messages:
            entry = self.model[message.id]
            assert message.envelope is not None and message.envelope.payload == entry.payload
            entry.state, entry.deadline = "inflight", claim.lease_deadline_ms
        self.deadlines.append(claim.lease_deadline_ms)
        TALLY["claimed"] += len(claimed)

    def _draw_lease(self, data: st.DataObject) -> tuple[int, list[str]]:
        """A lease token (mostly a live one, sometimes a stale one) and ids, mostly ones it holds."""
        live = sorted({e.deadline for e in self.model.values() if e.state == "inflight"})
        deadline = data.draw(st.sampled_from(live) | st.sampled_from(live) | st.sampled_from(self.deadlines))
        holders = sorted(id for id, e in self.model.items() if e.state == "inflight" and e.deadline == deadline)
        pool = st.sampled_from(holders) | st.sampled_from(holders) | ids if holders else ids
        return deadline, data.draw(st.lists(pool, min_size=1, max_size=4))

    @precondition(lambda self: any(entry.state == "inflight" for entry in self.model.values()))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        deadline, chosen = self._draw_lease(data)
        held = {id for id in chosen if self._held(id, deadline)}
        assert self.store.ack(deadline, chosen) == len(held)
        for id in held:
            del self.model[id]
        self.counters["promoted"] += len(held)
        TALLY["acked"] += len(held)

    @precondition(lambda self: any(entry.state == "inflight" for entry in self.model.values()))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        deadline, chosen_ids = self._draw_lease(data)
        chosen = [(id, data.draw(actions)) for id in chosen_ids]
        outcomes = self.store.nack(deadline, [(id, f"failed: {action}", action) for id, action in chosen])  # type: ignore[misc]
        expected = []
        for id, action in chosen:
            if not self._held(id, deadline):
                expected.append("not held")
                continue
            entry = self.model[id]
            if action == "release":
                entry.state, entry.ready = "due", True
                expected.append("released")
                continue
            entry.attempts += 1
            if action == "dead" or entry.attempts >= MAX_ATTEMPTS:
                self._dead_letter(entry)
                expected.append("dead")
            else:
                entry.state, entry.ready = "due", False  # back after the (hour-long) backoff
                self.counters["retried"] += 1
                expected.append("retried")
        assert outcomes == expected
        TALLY.update(f"nack {outcome}" for outcome in outcomes)

    @rule(batch=st.integers(1, 4))
    def promote_direct(self, batch: int) -> None:
        before = self.client.llen(self.ready_key)
        ready = self._ready()
        result = self.store.promote_direct(self.routes, batch, "p")
        assert (result.promoted, result.dead_lettered) == (min(batch, len(ready)), 0)
        pushed = self.client.lrange(self.ready_key, before, -1)
        promoted = {payload.decode().split("#")[0] for payload in pushed}
        assert promoted <= ready and len(promoted) == result.promoted
        for id in promoted:
            assert self.model[id].payload in pushed
            del self.model[id]
        self.counters["promoted"] += result.promoted
        TALLY["promoted direct"] += result.promoted

    # -- dead letters --------------------------------------------------------------------------------------

    @precondition(lambda self: any(entry.state == "dead" for entry in self.model.values()))
    @rule(chosen=st.none() | id_lists)
    def requeue(self, chosen: list[str] | None) -> None:
        dead = {id for id, entry in self.model.items() if entry.state == "dead"}
        expected = dead if chosen is None else dead & set(chosen)
        assert self.store.requeue_dead(chosen).count == len(expected)
        for id in expected:
            entry = self.model[id]
            entry.state, entry.ready, entry.attempts = "due", True, 0
        self.counters["requeued"] += len(expected)
        TALLY["requeued"] += len(expected)

    @precondition(lambda self: any(entry.state == "dead" for entry in self.model.values()))
    @rule(chosen=st.none() | id_lists)
    def purge(self, chosen: list[str] | None) -> None:
        dead = {id for id, entry in self.model.items() if entry.state == "dead"}
        expected = dead if chosen is None else dead & set(chosen)
        assert self.store.purge_dead(chosen) == len(expected)
        for id in expected:
            del self.model[id]
        TALLY["purged"] += len(expected)

    @precondition(lambda self: any(entry.state == "inflight" for entry in self.model.values()))
    @rule()
    def lease_expiry(self) -> None:
        """Wait out every lease of 1 ms, then claim nothing new: expired leases go back (or die)."""
        time.sleep(0.003)
        self.claim(batch=4, short_lease=False, pause=False)

    # -- invariants ----------------------------------------------------------------------------------------

    @invariant()
    def partition_and_payloads(self) -> None:
        k = self.store.keys
        due = {m.decode() for m in self.client.zrange(k.due, 0, -1)}
        inflight = {m.decode() for m in self.client.zrange(k.inflight, 0, -1)}
        dead = {m.decode() for m in self.client.zrange(k.dead, 0, -1)}
        assert not (due & inflight or due & dead or inflight & dead), "an id in two states"
        by_state = {s: {id for id, e in self.model.items() if e.state == s} for s in ("due", "inflight", "dead")}
        packed = self._packed()
        assert (due, inflight, dead) == (by_state["due"] - packed, by_state["inflight"], by_state["dead"])
        present = due | inflight | dead
        assert {f.decode() for f in self.client.hkeys(k.msg)} == present, "payload stored iff the id is"
        assert {f.decode() for f in self.client.hkeys(k.leased)} == inflight
        # A message packed by a reschedule keeps its attempts and error.
        assert {f.decode() for f in self.client.hkeys(k.attempts)} <= present | packed
        assert {f.decode() for f in self.client.hkeys(k.errors)} <= present | packed

    @invariant()
    def packed_index_and_packs(self) -> None:
        k = self.store.keys
        index: dict[str, bytes] = {}
        for key in self.client.scan_iter(match=k.key("packed:*")):
            for field, location in self.client.hgetall(key).items():
                index[str(uuid.UUID(bytes=field))] = location
        assert set(index) == self._packed(), "the index holds exactly the packed ids"
        live = {name.decode(): int(count) for name, count in self.client.hgetall(k.pack_live).items()}
        assert sum(live.values()) == len(index) and all(count > 0 for count in live.values())
        assert set(live) == {name.decode() for name in self.client.zrange(k.packs, 0, -1)}
        for id, value in index.items():
            location = Location.from_index(value)
            base = int(self.client.hget(k.pack_base, location.pack) or 0)
            record = self.client.lindex(k.pack(location.pack), location.position - base)
            assert record is not None and record[:16] == uuid.UUID(id).bytes
            assert record[22:] == self.store.get(id).raw

    @invariant()
    def stats_match_the_model(self) -> None:
        TALLY["steps checked"] += 1
        stats = self.store.stats()
        states = Counter(entry.state for entry in self.model.values())
        assert (stats.parked, stats.inflight, stats.dead) == (states["due"], states["inflight"], states["dead"])
        assert stats.overdue == len(self._ready())
        assert sum(stats.histogram) == stats.parked - stats.overdue
        assert stats.counters == {name: value for name, value in self.counters.items() if value}

    @invariant()
    def get_reports_the_model(self) -> None:
        for id in IDS:
            info = self.store.get(id)
            entry = self.model.get(id)
            if entry is None:
                assert info is None
                continue
            assert info is not None
            assert (info.state, info.attempts) == (entry.state, entry.attempts)
            assert info.envelope is not None and info.envelope.payload == entry.payload
            if entry.state == "inflight":
                assert info.at_ms == entry.deadline


def test_any_sequence_of_operations_keeps_the_invariants(redis_server: EmbeddedRedis) -> None:
    StoreMachine.server = redis_server
    TALLY.clear()
    started = time.monotonic()
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    elapsed = time.monotonic() - started
    print(f"store state machine: 50 examples of up to 30 steps in {elapsed:.1f} s, 0 violations; {dict(TALLY)}")
    assert TALLY["claimed"] and TALLY["parks"], "the runs did reach the store"


@pytest.mark.parametrize("duplicates", [["id-0", "id-0"], ["id-0", "id-0", "id-0"]])
def test_ids_repeated_in_one_call_count_once(store, duplicates: list[str]) -> None:
    store.park("id-0", Envelope(route="ready", payload=b"x"), delay=0)
    claim = store.claim(1, lease=30, promoter_id="p")
    assert store.ack(claim.lease_deadline_ms, duplicates) == 1
    assert store.stats().counters["promoted"] == 1
