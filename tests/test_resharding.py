"""Changing a namespace's shard count online (``DelayStore.reshard``, ``delay-broker reshard``) on a real Redis: every
message re-homed once, found by id all along, each crash window of a batch closed by the next run (or a read, or a
promoter), stale processes refused and following. Under load, with a SIGKILL: integration/test_store_reshard.py."""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from delay_broker import ConfigurationError, DelayStore, LayoutChanged, ListTarget, ParkRequest
from delay_broker.cli import cli
from delay_broker.deliverers import DirectLists
from delay_broker.keys import shard_tags
from delay_broker.schedule_defs import occurrence_id
from delay_broker.store import rehoming, resharding
from delay_broker.store.layouts import Layout
from delay_broker.store.resharding import ReshardRefused

from .helpers import envelope

FAST = {"settle": 0.05}


@pytest.fixture
def cleanup(client: redis.Redis, namespace: str) -> Iterator[None]:
    yield
    keys = list(client.scan_iter(f"delay_broker:{{{namespace}*"))
    for key in keys:
        client.delete(key)


def fill(store: DelayStore, count: int, *, delay: float | None = None) -> list[str]:
    """``count`` messages of uuid ids: every other one due in a minute (ordinary layout), the rest in a day (packed),
    or all in ``delay``."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    store.park_many(
        [ParkRequest(id, envelope(id.encode()), delay=delay if delay is not None else (60 if n % 2 else 86_400))
         for n, id in enumerate(ids)]
    )  # fmt: skip
    return ids


def held_in(store: DelayStore, shard: int, id: str) -> bool:
    state = store._runner.by_id("get", shard, [id], [id], write=False)[0]
    return bool(state != b"gone")


def homes_hold(store: DelayStore, ids: list[str]) -> bool:
    view = store._shards.view()
    return all(held_in(store, view.home(id), id) for id in ids)


def promote_all(store: DelayStore, target: str, *, new_only: bool = False) -> int:
    """Promote everything due (``new_only``: in the shards a reshard adds, what it parked there) into ``target``."""
    routes = DirectLists({"ready": ListTarget(target)}).direct_routes()
    view = store._shards.view()
    promoted = 0
    for shard in view.serving:
        if new_only and shard in (view.old or ()):
            continue
        while found := store.promote_direct(routes, 1000, "test", shard=shard).promoted:
            promoted += found
    return promoted


def test_a_reshard_moves_every_message_to_its_new_home_and_keeps_the_counts(
    client: redis.Redis, namespace: str, cleanup: None
) -> None:
    store = DelayStore(client, namespace=namespace, shards=3)
    ids = fill(store, 1200)
    dead = [f"dead-{n}" for n in range(60)]
    store.park_many([ParkRequest(id, envelope(), delay=0) for id in dead])
    for shard in range(3):
        claim = store.claim(1000, 30, "p", shard=shard)
        store.nack(claim.lease_deadline_ms, [(m.id, "it broke", "dead") for m in claim.messages], shard=shard)
    due_ms = store.now_ms() + 3_600_000  # as a scheduler makes it: the id of the schedule's name and due ms
    occurrence = occurrence_id(namespace, "nightly", due_ms)
    store.park_occurrence("nightly", occurrence, envelope(), datetime.fromtimestamp(due_ms / 1000, timezone.utc))
    before = store.stats()
    letters = [store.get(id) for id in dead]
    parked = [store.get(id) for id in ids[:50]]

    steps: list[str] = []
    report = store.reshard(12, progress=lambda step, moved: steps.append(step), **FAST)

    assert report.done and report.after == Layout(1, 12, "stable", 3) and report.moved > 1000
    after = DelayStore(client, namespace=namespace)  # a process started afterwards
    assert len(after.shards) == 12 and after.stats().shards == 12
    stats = after.stats()
    assert (stats.parked, stats.dead, stats.packed) == (before.parked, before.dead, before.packed)
    assert {k: stats.counters[k] for k in ("parked", "dead_lettered")} == {
        k: before.counters[k] for k in ("parked", "dead_lettered")
    }
    assert homes_hold(after, ids + dead)
    assert [after.get(id) for id in dead] == letters, "dead letters with their error, attempts and envelope"
    assert [after.get(id) for id in ids[:50]] == parked
    assert held_in(after, 0, occurrence), "a schedule's occurrence stays in shard 0"
    assert any(step.startswith("announcing") for step in steps) and "finishing" in steps
    layout = json.loads(client.get(store.keys.layout))  # type: ignore[arg-type]
    assert layout == {"generation": 1, "shards": 12, "previous": 3}
    # The shards the new layout leaves keep their marker alone; the batches' tokens are gone.
    leaving = set(shard_tags(namespace, 3)) - set(shard_tags(namespace, 12))
    for tag in leaving:
        assert sorted(client.scan_iter(f"delay_broker:{{{tag}}}:*")) == [f"delay_broker:{{{tag}}}:generation".encode()]
    assert not list(client.scan_iter(f"delay_broker:{{{namespace}*}}:rehomed"))
    again = store.reshard(12, **FAST)
    assert again.done and again.moved == 0 and again.passes == 0


def test_a_dry_run_changes_nothing_and_estimates_what_moves(client: redis.Redis, namespace: str, cleanup: None) -> None:
    store = DelayStore(client, namespace=namespace, shards=3)
    ids = fill(store, 900)
    report = store.reshard(12, dry_run=True)
    assert report.dry_run and not report.done and report.before == Layout(0, 3)
    assert [counts.role for counts in report.shards] == ["in use"] * 3
    assert sum(counts.parked for counts in report.shards) == 900
    # A shard whose tag the 12-shard layout keeps (always shard 0, sometimes another, by the namespace's hash)
    # keeps a quarter of its messages; the estimate samples ids, so it is near the true count, not equal to it.
    old, new = shard_tags(namespace, 3), shard_tags(namespace, 12)
    moving = sum(old[crc % 3] != new[crc % 12] for crc in (zlib.crc32(id.encode()) for id in ids))
    assert abs(report.estimate - moving) <= 45, (report.estimate, moving)
    assert client.get(store.keys.layout) == b"3"


def test_a_batch_is_re_homed_once_whichever_step_a_kill_interrupts(
    client: redis.Redis, namespace: str, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after taking a batch, after parking part of it, or before dropping it: promoters promote what is
    in a new home meanwhile, the next run finishes the batch, and every message is promoted exactly once."""
    store = DelayStore(client, namespace=namespace, shards=3, pack_after=None)
    ids = fill(store, 900, delay=0)
    target = f"{namespace}:ready"
    for crash in ("take", "put", "drop"):
        broken = DelayStore(client, namespace=namespace)
        kill_after(monkeypatch, broken._rehoming, crash)
        with pytest.raises(Killed):
            broken.reshard(12, batch=200, **FAST)
        monkeypatch.undo()
        # Promoters go on meanwhile: what was parked into new homes before the kill is promoted from there.
        assert promote_all(DelayStore(client, namespace=namespace), target, new_only=True)
    store.reshard(12, **FAST)
    promote_all(store, target)
    promoted = [item.decode() for item in client.lrange(target, 0, -1)]
    assert len(promoted) == len(ids) and set(promoted) == set(ids), "each message promoted exactly once"
    assert store.stats().parked == 0


class Killed(Exception):
    pass


def kill_after(monkeypatch: pytest.MonkeyPatch, part: rehoming.Rehoming, step: str) -> None:
    """The reshard "killed" at ``step`` of its second batch: after taking it (before any put), after its first put,
    or after all its puts (before the drop)."""
    calls = {"take": 0, "put": 0}
    take, put, drop = part.take, part.put, part.drop

    def taking(*args: Any, **kwargs: Any) -> Any:
        calls["take"] += 1
        return take(*args, **kwargs)

    def putting(*args: Any, **kwargs: Any) -> Any:
        if step == "take" and calls["take"] == 2:
            raise Killed
        result = put(*args, **kwargs)
        calls["put"] += 1
        if step == "put" and calls["take"] == 2:
            raise Killed
        return result

    def dropping(*args: Any, **kwargs: Any) -> Any:
        if step == "drop" and calls["take"] == 2:
            raise Killed
        return drop(*args, **kwargs)

    monkeypatch.setattr(part, "take", taking)
    monkeypatch.setattr(part, "put", putting)
    monkeypatch.setattr(part, "drop", dropping)


def left_in_transit(client: redis.Redis, store: DelayStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A reshard to 12 killed right after taking its first batch (of 50): the ids left in transit."""

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(store._rehoming, "put", killed)
        with pytest.raises(Killed):
            store.reshard(12, batch=50, **FAST)
    moving = [key.decode() for space in store.shards for key in client.hkeys(space.moving)]  # type: ignore[union-attr]
    assert 0 < len(moving) <= 50
    return moving


def test_reads_and_writes_by_id_find_a_message_in_transit_and_none_comes_back(
    client: redis.Redis, namespace: str, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DelayStore(client, namespace=namespace, shards=3)
    fill(store, 300)
    transit = left_in_transit(client, store, monkeypatch)
    reader = DelayStore(client, namespace=namespace)
    info = reader.get(transit[0])
    assert info is not None and info.state == "due" and info.envelope is not None
    assert info.envelope.payload == transit[0].encode()
    assert not any(client.hlen(space.moving) for space in store.shards), "the read finished the batch"
    transit = left_in_transit(client, store, monkeypatch)
    assert reader.cancel(transit[1])
    assert reader.reschedule(transit[2], delay=7200) is not None
    kept = reader.park(transit[3], envelope(b"newer"), delay=30, on_conflict="keep")
    assert kept.outcome == "kept"
    store.reshard(12, **FAST)
    assert reader.get(transit[1]) is None, "a cancelled message is not parked again by the next run"
    assert reader.get(transit[3]).envelope.payload == transit[3].encode()  # type: ignore[union-attr]
    assert reader.stats().parked == 299


def test_a_promoter_finishes_a_batch_a_killed_reshard_left(
    client: redis.Redis, namespace: str, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DelayStore(client, namespace=namespace, shards=3)
    fill(store, 200)
    transit = left_in_transit(client, store, monkeypatch)
    promoter_side = DelayStore(client, namespace=namespace)
    promoter_side.refresh_layout()
    assert sum(client.hlen(space.moving) for space in store.shards) == len(transit), "too fresh to be stranded"
    monkeypatch.setattr(rehoming, "STRANDED_AFTER_MS", -1000)
    promoter_side.refresh_layout()
    assert not any(client.hlen(space.moving) for space in store.shards)
    assert homes_hold(promoter_side, transit)


def test_a_stale_process_is_refused_and_parks_by_the_new_layout(
    client: redis.Redis, namespace: str, cleanup: None
) -> None:
    stale = DelayStore(client, namespace=namespace, shards=3)
    stale.park("first", envelope(), delay=60)
    DelayStore(client, namespace=namespace).reshard(12, **FAST)
    stale._shards._read_at = time.monotonic() + 3600  # as if it had just read the layout: 3 shards, generation 0
    ids = [str(uuid.uuid4()) for _ in range(40)]
    moved = [id for id in ids if stale._shards.view().home(id) != DelayStore(client, namespace=namespace).shard_for(id)]
    assert moved
    for n, id in enumerate(ids):  # the one-message path, then park.lua, then a batch
        stale.park(id, envelope(), delay=60 if n % 2 else 86_400)
    stale.park_many([ParkRequest(f"b-{n}", envelope(), delay=60) for n in range(30)])
    assert len(stale._shards.view().homes) == 12 and stale._shards.view().generation == 1
    fresh = DelayStore(client, namespace=namespace)
    assert homes_hold(fresh, [*ids, *(f"b-{n}" for n in range(30)), "first"])
    # The refusal itself, as the script says it: a park by generation 0 into a shard at generation 1.
    old = Layout(0, 3)
    with pytest.raises(LayoutChanged, match="generation 1") as refused:
        space = stale.shards[0]
        stale._runner.run(
            "park_one", 0, ["x", "60000", b"r", bytes(16), "0:0", -1, old.generation], extra=[space.packs]
        )
    assert refused.value.generation == 1


def test_a_process_given_the_old_count_follows_a_reshard_but_one_started_afterwards_is_refused(
    client: redis.Redis, namespace: str, cleanup: None
) -> None:
    running = DelayStore(client, namespace=namespace, shards=3)
    running.park("a", envelope(), delay=60)
    DelayStore(client, namespace=namespace).reshard(12, **FAST)
    running.refresh_layout()
    assert running._shards.count == 12
    running.park("b", envelope(), delay=60)
    with pytest.raises(ConfigurationError, match=r"has 12 shard.*resharded from 3.*reshard --to"):
        DelayStore(client, namespace=namespace, shards=3).stats()
    DelayStore(client, namespace=namespace, shards=12).stats()


def test_one_reshard_at_a_time(
    client: redis.Redis, namespace: str, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resharding, "LOCK_SECONDS", 0.5)
    store = DelayStore(client, namespace=namespace, shards=2)
    store.park("a", envelope(), delay=60)
    client.set(store.keys.layout, Layout(0, 2).announced(8, store.now_ms()).encode())
    with pytest.raises(ReshardRefused, match=r"being resharded already.*--to 8"):
        store.reshard(4, **FAST)
    client.set(store.keys.reshard_lock, "someone", px=60_000)
    with pytest.raises(ReshardRefused, match="another `delay-broker reshard`"):
        store.reshard(8, **FAST)


@pytest.mark.parametrize(
    "raw",
    ['{"generation": 1}', '{"generation": 1, "shards": 0}', '{"generation": -1, "shards": 3}', "[3]", "3x",
     '{"generation": 1, "shards": 3, "state": "moving"}', '{"generation": 1, "shards": 3, "colour": 1}'],
)  # fmt: skip
def test_a_malformed_layout_is_refused(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="malformed shard layout"):
        Layout.parse(raw, "key")


def test_layouts_read_what_they_write() -> None:
    for layout in (
        Layout(0, 3),
        Layout(0, 3).announced(12, 1000),
        Layout(0, 3).announced(12, 1000).moving(2000),
        Layout(0, 3).announced(12, 1000).moving(2000).finished(),
    ):
        assert Layout.parse(layout.encode(), "key") == layout
    assert Layout(0, 3).encode() == "3" and Layout.parse(None, "key") == Layout(recorded=False)


def test_the_command_shows_then_reshards(client: redis.Redis, namespace: str, cleanup: None, redis_server: Any) -> None:
    store = DelayStore(client, namespace=namespace, shards=2)
    fill(store, 100)
    runner = CliRunner()
    base = ["reshard", "--to", "5", "-r", redis_server.url, "-n", namespace]
    dry = runner.invoke(cli, base, catch_exceptions=False)
    assert dry.exit_code == 0 and "Dry run" in dry.output and "Nothing changed" in dry.output
    done = runner.invoke(cli, [*base, "--yes", "--settle", "0.05", "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    report = json.loads(done.output[done.output.index("{") :])
    assert report["done"] and report["after"] == "5 shard(s), generation 1" and report["moved"] > 50
    assert DelayStore(client, namespace=namespace).stats().parked == 100
