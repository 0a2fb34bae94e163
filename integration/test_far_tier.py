"""The far tier on a real PostgreSQL server and a real redis-server: parking, moving, both tiers seen as one,
movers killed and stalled, PostgreSQL down and restarted, and a real Dramatiq worker running a far message."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from click.testing import CliRunner

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.celery import cancel as celery_cancel
from delay_broker.cli import cli
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import EmbeddedRedis
from delay_broker.errors import (
    DelayBrokerError,
    FarTierUnavailable,
    InvalidDelay,
    InvalidMessage,
    StoreError,
    StoreUnavailable,
)
from delay_broker.far import FarRow, FarTier
from delay_broker.operations import MessageFilter, Operations
from tests.helpers import wait_for as shared_wait_for

from .celery_apps.brokers import env_for
from .servers import PostgresServer
from .test_chaos_redis import Promoters, delivered, figures
from .test_dramatiq_brokers import Deployment, running

wait_for = functools.partial(shared_wait_for, interval=0.05)
HORIZON = 2.0


@pytest.fixture
def tiered(
    redis_server: EmbeddedRedis, postgres: PostgresServer, unique: str
) -> Iterator[tuple[DelayStore, redis.Redis, str]]:
    client = redis_server.client()
    tier = FarTier(postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0)
    store = DelayStore(client, namespace=f"far-{unique}", far_tier=tier)
    target = f"far-{unique}:ready"
    yield store, client, target
    client.delete(target, *client.scan_iter(match=store.keys.pattern))
    with psycopg.connect(postgres.url, autocommit=True) as connection:
        connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (f"delay_broker:far-{unique}",))
    client.close()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of the test's own, to stop and restart; stopped however the test ends."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.close()


def redis_holds(client: redis.Redis, store: DelayStore) -> tuple[int, int]:
    return client.zcard(store.keys.due), client.hlen(store.keys.msg)


def promote(store: DelayStore, target: str) -> int:
    return store.promote_direct({"ready": ListTarget(target, mode="rpush")}, 1000, "test").promoted


def test_a_far_message_costs_redis_nothing_and_is_seen_in_both_tiers(tiered: Any) -> None:
    store, client, _ = tiered
    near = store.park("near", Envelope("ready", b"n"), delay=1)
    far = store.park("far", Envelope("ready", b"f", name="task"), delay=3600)
    assert (near.outcome, far.outcome) == ("new", "new")
    assert redis_holds(client, store) == (1, 1)  # only the near one

    info = store.get("far")
    assert info is not None and info.state == "due" and info.due_ms == far.due_ms
    assert info.envelope is not None and info.envelope.payload == b"f" and info.envelope.name == "task"
    assert [m.id for m in store.list_messages()] == ["near", "far"]
    assert [m.id for m in store.list_messages(start_ms=far.due_ms - 1)] == ["far"]
    assert [m.id for m in store.iter_all()] == ["near", "far"]
    stats = store.stats()
    assert (stats.parked, stats.far, stats.histogram[:2]) == (2, 1, [1, 1])


def test_find_and_filtered_actions_see_far_rows_as_parked_messages(tiered: Any) -> None:
    """What the dashboard and ``delay-broker ls`` use: filters, text search, pages and bulk actions reach rows."""
    store, client, _ = tiered
    store.park("near-a", Envelope("mail", b'{"to": "ann"}', name="send"), delay=60)
    store.park("far-a", Envelope("mail", b'{"to": "ann"}', name="send"), delay=3600)
    store.park("far-b", Envelope("mail", b'{"to": "bob"}', name="send"), delay=7200)
    store.park("far-c", Envelope("reports", b'{"to": "ann"}', name="build"), delay=9000)
    operations = Operations(store)

    def ids(**fields: Any) -> list[str]:
        return [message.id for message in operations.find(MessageFilter(**fields)).messages]

    assert ids() == ["near-a", "far-a", "far-b", "far-c"]  # by due time, Redis and the table merged
    assert ids(queue="mail", task="send") == ["near-a", "far-a", "far-b"]
    assert ids(text="ANN") == ["near-a", "far-a", "far-c"]
    assert ids(id_prefix="far-", queue="mail", text="bob") == ["far-b"]
    assert ids(start_ms=store.get("far-b").due_ms) == ["far-b", "far-c"]  # type: ignore[union-attr]
    assert ids(state="dead") == []  # the tier holds parked messages only

    pages, cursor = [], None
    while True:  # one message a page: the cursor goes on in each source, the table included
        page = operations.find(MessageFilter(text="ann"), cursor=cursor, limit=1)
        pages += [message.id for message in page.messages]
        if (cursor := page.cursor) is None:
            break
    assert pages == ["near-a", "far-a", "far-c"]
    assert operations.count(MessageFilter(queue="mail")).matched == 3

    result = operations.cancel(filter=MessageFilter(queue="mail", text="ann"))
    assert (result.matched, result.done) == (2, 2)
    assert ids() == ["far-b", "far-c"]
    assert redis_holds(client, store) == (0, 0)


def test_rows_come_into_redis_within_the_horizon_and_run_once_after_due(tiered: Any) -> None:
    store, client, target = tiered
    parked = store.park_many(
        ParkRequest(f"m{n}", Envelope("ready", f"m{n}".encode()), delay=HORIZON + 1 + n * 0.1) for n in range(20)
    )
    assert redis_holds(client, store) == (0, 0)
    promoter = Promoter(store, DirectLists({"ready": ListTarget(target, mode="rpush")}), max_idle=0.2).start()
    try:
        wait_for(lambda: client.llen(target) == 20, 20, "all 20 delivered")
        time.sleep(0.5)
    finally:
        promoter.stop()
    received = delivered(client, target)
    assert set(received) == {f"m{n}" for n in range(20)} and max(received.values()) == 1
    assert store.stats().far == 0 and client.zcard(store.keys.moved) == 0
    lateness = promoter.counters
    assert lateness.promoted == 20 and all(result.due_ms > 0 for result in parked)
    counters = store.stats().counters
    assert (counters.get("parked"), counters.get("moved_in"), counters.get("promoted")) == (20, 20, 20)


def test_a_message_parked_again_across_the_tiers_is_counted_parked_once(tiered: Any) -> None:
    store, _, _ = tiered
    store.park("a", Envelope("ready", b"1"), delay=3600)  # a far row
    store.park("a", Envelope("ready", b"2"), delay=3600)  # replaces the row
    store.park("a", Envelope("ready", b"3"), delay=1)  # into Redis, replacing the row
    store.park("a", Envelope("ready", b"4"), delay=3600)  # a far row again, replacing the copy in Redis
    counters = store.stats().counters
    assert (counters.get("parked"), counters.get("replaced")) == (1, 3), counters
    assert store.get("a").envelope.payload == b"4"


def test_cancel_and_reschedule_reach_either_tier(tiered: Any) -> None:
    store, client, _ = tiered
    store.park("a", Envelope("ready", b"a"), delay=3600)
    store.park("b", Envelope("ready", b"b"), delay=3600)
    store.park("c", Envelope("ready", b"c"), delay=1)
    assert store.stats().counters.get("parked") == 3, "a far park counts as one, as a park in Redis does"
    assert store.cancel_each(["a", "c", "nope"]) == [True, True, False]
    assert store.get("a") is None and store.get("c") is None
    assert store.stats().counters.get("cancelled") == 2, "a far row cancelled counts as one"

    later = store.reschedule("b", delay=7200, envelope=Envelope("ready", b"b2"))
    info = store.get("b")
    assert info is not None and info.due_ms == later and info.raw is not None and info.raw.endswith(b"b2")
    assert redis_holds(client, store) == (0, 0)
    soon = store.reschedule("b", delay=0.5)  # within the horizon: moved into Redis at once
    assert soon is not None and redis_holds(client, store) == (1, 1) and store.stats().far == 0
    assert store.get("b").due_ms == soon  # type: ignore[union-attr]


def test_a_far_rewrite_read_before_the_id_was_parked_again_is_refused(tiered: Any) -> None:
    store, _, _ = tiered
    store.park("task", Envelope("ready", b"first"), delay=3600)
    read = store.get("task")
    store.park("task", Envelope("ready", b"retry"), delay=3700)  # a new row, far too
    assert store.reschedule("task", delay=7200, envelope=Envelope("ready", b"first, moved"), expected=read) is None
    info = store.get("task")
    assert info is not None and info.envelope is not None and info.envelope.payload == b"retry"
    assert store.reschedule("task", delay=7200, envelope=Envelope("ready", b"moved"), expected=info) is not None
    assert store.get("task").envelope.payload == b"moved"  # type: ignore[union-attr]


def test_one_copy_per_id_across_the_tiers(tiered: Any) -> None:
    store, client, _ = tiered
    store.park("x", Envelope("ready", b"far"), delay=3600)
    replaced = store.park("x", Envelope("ready", b"near"), delay=1)  # replaces the row
    assert replaced.outcome == "replaced" and store.stats().far == 0 and redis_holds(client, store) == (1, 1)
    back = store.park("x", Envelope("ready", b"far again"), delay=3600)  # replaces the Redis copy
    assert back.outcome == "replaced" and store.stats().far == 1 and redis_holds(client, store) == (0, 0)

    kept = store.park("x", Envelope("ready", b"ignored"), delay=1, on_conflict="keep")
    assert kept.outcome == "kept" and kept.due_ms == back.due_ms and redis_holds(client, store) == (0, 0)
    store.park("y", Envelope("ready", b"near"), delay=1)
    kept = store.park("y", Envelope("ready", b"ignored"), delay=3600, on_conflict="keep")
    assert kept.outcome == "kept" and store.stats().far == 1
    assert store.get("x").raw.endswith(b"far again")  # type: ignore[union-attr]


def test_a_mover_killed_after_its_adoption_never_moves_a_row_twice(tiered: Any) -> None:
    store, client, target = tiered
    store.park("once", Envelope("ready", b"once"), delay=HORIZON + 0.3)
    now = store.now_ms()

    def adopt_then_die(rows: list[FarRow]) -> None:
        store._tier.sweeper.adopt(rows, now + 5000)
        raise KeyboardInterrupt  # the process dies: its transaction never commits

    with pytest.raises(KeyboardInterrupt):
        store._tier.table.move(now + 10_000, 100, 5000, adopt_then_die)
    # The row stayed, and its token.
    assert store._tier.table.get("once") is not None and client.zcard(store.keys.moved) == 1
    stats = store.stats()  # counted once: in Redis, where it was moved, not in the table it is leaving
    assert (stats.parked, stats.far) == (1, 0) and [info.id for info in store.list_messages()] == ["once"]
    wait_for(lambda: promote(store, target), 5, "the adopted copy promoted")
    assert store.sweep_far() == 1  # the row is found moved already: deleted, not parked again
    assert store.stats().far == 0 and store.get("once") is None and redis_holds(client, store) == (0, 0)
    assert client.zcard(store.keys.moved) == 0 and client.lrange(target, 0, -1) == [b"once"]


def test_a_stalled_mover_is_refused_once_its_lease_ran_out(tiered: Any) -> None:
    store, client, _ = tiered
    store.park("late", Envelope("ready", b"late"), delay=HORIZON + 0.3)
    with pytest.raises(StoreError, match="stalled past its lease"):
        store._tier.table.move(
            store.now_ms() + 10_000, 100, 5000, lambda rows: store._tier.sweeper.adopt(rows, store.now_ms() - 1)
        )
    assert store.stats().far == 1 and redis_holds(client, store) == (0, 0) and client.zcard(store.keys.moved) == 0


def mover_dies_after_adopting(store: DelayStore) -> None:
    """A mover adopts every far row due within the hour into Redis and dies before its row deletes commit: the
    rows are left behind, retired (their tokens recorded in ``moved``)."""
    now = store.now_ms()

    def adopt_then_die(rows: list[FarRow]) -> None:
        store._tier.sweeper.adopt(rows, now + 5000)
        raise KeyboardInterrupt  # the process dies: its row delete never commits

    with pytest.raises(KeyboardInterrupt):
        store._tier.table.move(now + 3_700_000, 100, 5000, adopt_then_die)  # type: ignore[union-attr]


def test_a_row_left_behind_its_recorded_token_is_deleted_and_its_id_free_again(tiered: Any) -> None:
    """A row whose message is in Redis already (its token recorded; its delete never committed) would otherwise
    stay until its due time: weeks later maybe, and meanwhile a ``keep`` park of its id kept it and wrote
    nothing. The orphan check deletes it, then drops the token; recent tokens are left to their movers."""
    store, client, target = tiered
    store.park("left", Envelope("ready", b"old"), delay=3600)
    mover_dies_after_adopting(store)
    assert (
        store._tier.table is not None
        and store._tier.table.get("left") is not None
        and client.zcard(store.keys.moved) == 1
    )
    assert store.forget_moved_orphans() == 0, "a recent token is left alone"
    with psycopg.connect(store._tier.table.url) as holder:  # a park or mover holding the row: not waited for long
        holder.execute(
            f"SELECT 1 FROM {store._tier.table.table} WHERE token = %s FOR UPDATE",
            (store._tier.table.get("left").token,),
        )
        assert store.forget_moved_orphans(older_than=0) == 0 and client.zcard(store.keys.moved) == 1
    assert store.forget_moved_orphans(older_than=0) == 1
    assert store._tier.table.get("left") is None and client.zcard(store.keys.moved) == 0
    assert store.reschedule("left", delay=0) is not None  # the copy in Redis is the message
    wait_for(lambda: promote(store, target), 5, "the moved copy promoted")
    assert store.park("left", Envelope("ready", b"new"), delay=3600, on_conflict="keep").outcome == "new"
    assert client.lrange(target, 0, -1) == [b"old"]


def test_an_id_whose_row_is_retired_is_free_for_keep_parks_and_not_rescheduled(tiered: Any) -> None:
    """Before the orphan check deletes it, a row whose message moved into Redis and ran (its delete never
    committed) is no message: a ``keep`` park of its id, far or near, parks the new one, and a reschedule finds
    nothing to move."""
    store, _, _ = tiered
    for id in ("far", "near"):
        store.park(id, Envelope("ready", b"old"), delay=3600)
    mover_dies_after_adopting(store)
    assert store._parking.cancel(["far", "near"]) == [2, 2]  # removed while parked, as if the moved copies had run
    assert store.reschedule("far", delay=60) is None
    assert store.park("far", Envelope("ready", b"new"), delay=3600, on_conflict="keep").outcome == "new"
    assert store.park("near", Envelope("ready", b"new"), delay=1, on_conflict="keep").outcome == "new"
    for id in ("far", "near"):
        info = store.get(id)
        assert info is not None and info.envelope is not None and info.envelope.payload == b"new", id
    assert store.stats().parked == 2


def test_cancel_of_an_id_whose_row_is_retired_and_whose_message_ran_reports_nothing_cancelled(tiered: Any) -> None:
    store, _, _ = tiered
    store.park("ran", Envelope("ready", b"old"), delay=3600)
    mover_dies_after_adopting(store)
    assert store._parking.cancel(["ran"]) == [2]  # removed while parked, as if the moved copy had run
    counted = store.stats().counters.get("cancelled")
    assert store.cancel("ran") is False
    assert store.stats().counters.get("cancelled") == counted
    assert store.stats().far == 0, "the retired row is gone too"


def frozen(server: PostgresServer) -> list[int]:
    """The postmaster and its backends, to SIGSTOP: a server that stops answering on open connections."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return [postmaster, *map(int, children)]


def test_a_postgresql_that_stops_answering_fails_a_park_after_the_timeout_instead_of_holding_it(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    """A server that hangs (not down: its kernel still answers TCP) held a far park for as long as it hung: a
    producer's send, or a worker's retry. The far tier's timeout breaks the connection, and the park fails
    clearly; a later one, once the server answers again, goes through."""
    client = redis_server.client()
    tier = FarTier(own_postgres.url, horizon=HORIZON, sweep_interval=0.2, timeout=2.0)
    store = DelayStore(client, namespace=f"pgfrozen-{unique}", far_tier=tier)
    frozen_now, outcome = threading.Event(), list[object]()

    def producer() -> None:  # its connection (one per thread) is open when the server stops answering
        store.park("before", Envelope("ready", b"before"), delay=3600)
        frozen_now.wait(30)
        outcome.append(_raised(lambda: store.park("far", Envelope("ready", b"far"), delay=3600)))

    parker = threading.Thread(target=producer, daemon=True)
    parker.start()
    wait_for(lambda: store.stats().far == 1, 10, "the first park")
    processes = frozen(own_postgres)
    try:
        for pid in processes:
            os.kill(pid, signal.SIGSTOP)
        frozen_now.set()
        parker.join(30)
        assert not parker.is_alive(), "the park still waits on the frozen server"
        assert isinstance(outcome[0], FarTierUnavailable), outcome
    finally:
        for pid in processes:
            os.kill(pid, signal.SIGCONT)
    assert redis_holds(client, store) == (0, 0), "nothing written for the failed park"
    assert store.park("far", Envelope("ready", b"far"), delay=3600).outcome == "new"
    assert store.stats().far == 2
    client.delete(*client.scan_iter(match=store.keys.pattern))


def _raised(call: Any) -> object:
    try:
        return call()
    except Exception as error:
        return error


def test_postgresql_down_refuses_far_parks_clearly_and_promotion_goes_on(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    server = own_postgres
    client = redis_server.client()
    store = DelayStore(
        client, namespace=f"pgdown-{unique}", far_tier=FarTier(server.url, horizon=HORIZON, sweep_interval=0.2)
    )
    target = f"pgdown-{unique}:ready"
    try:
        store.park("before", Envelope("ready", b"before"), delay=3600)
        server.stop("immediate")
        with pytest.raises(FarTierUnavailable, match="far tier: parking far messages failed on PostgreSQL"):
            store.park("far", Envelope("ready", b"far"), delay=3600)
        with pytest.raises(FarTierUnavailable):  # a near park replaces a far row of its id: it needs PostgreSQL
            store.park("near", Envelope("ready", b"near"), delay=0.2)
        assert redis_holds(client, store) == (0, 0)  # nothing written
        direct = DelayStore(client, namespace=f"pgdown-{unique}")  # what is in Redis promotes regardless
        direct.park("redis", Envelope("ready", b"redis"), delay=0.1)
        promoter = Promoter(store, DirectLists({"ready": ListTarget(target, mode="rpush")}), max_idle=0.2).start()
        try:
            wait_for(lambda: client.llen(target) == 1, 10, "the Redis message promoted while PostgreSQL is down")
            server.start()  # the row parked before the outage is still there
            assert store.get("before") is not None and store.stats().far == 1
        finally:
            promoter.stop()
    finally:
        client.delete(target, *client.scan_iter(match=store.keys.pattern))
        client.close()


def test_a_near_park_whose_commit_failed_never_lets_the_row_it_replaced_run(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    client = redis_server.client()
    tier = FarTier(own_postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0)
    store = DelayStore(client, namespace=f"commit-{unique}", far_tier=tier)
    target = f"commit-{unique}:ready"
    try:
        store.park("job", Envelope("ready", b"far"), delay=HORIZON + 0.5)
        real_park = store._parking.park_chunk

        def park_then_postgresql_dies(*args: Any, **kwargs: Any) -> Any:
            parked = real_park(*args, **kwargs)
            own_postgres.stop("immediate")  # the row's delete, after the park in Redis, never commits
            return parked

        store._parking.park_chunk = park_then_postgresql_dies  # type: ignore[method-assign]
        # Parked, and so reported: raising made the adapters send the message another way too, to run twice.
        assert store.park("job", Envelope("ready", b"near"), delay=0.2).outcome == "replaced"
        store._parking.park_chunk = real_park  # type: ignore[method-assign]
        own_postgres.start()
        assert store._tier.table is not None and store._tier.table.get("job") is not None, "the delete was rolled back"
        info = store.get("job")
        assert info is not None and info.envelope is not None and info.envelope.payload == b"near", "not the row"
        stats = store.stats()
        assert (stats.parked, stats.far) == (1, 0), "counted once, as the copy in Redis"
        wait_for(lambda: promote(store, target), 5, "the near copy promoted")
        wait_for(lambda: store.sweep_far() == 1, 5, "the old row, within the horizon, deleted as moved in already")
        assert store._tier.table.get("job") is None and store.get("job") is None and client.zcard(store.keys.moved) == 0
        assert promote(store, target) == 0 and client.lrange(target, 0, -1) == [b"near"], "run once, the near copy"
    finally:
        client.delete(target, *client.scan_iter(match=store.keys.pattern))
        client.close()


def test_withdraw_takes_the_copy_in_redis_back_while_postgresql_is_down(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    """What an adapter calls before sending a message another way after a failed park: the copy the park left in
    Redis must go, PostgreSQL or not, or the message runs twice."""
    client = redis_server.client()
    tier = FarTier(own_postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0)
    store = DelayStore(client, namespace=f"withdraw-{unique}", far_tier=tier)
    try:
        store.park("job", Envelope("ready", b"near"), delay=0.2)
        own_postgres.stop("immediate")
        assert store.withdraw("job", b"near")
        assert client.zcard(store.keys.due) == 0 and not client.hexists(store.keys.msg, "job")
    finally:
        client.delete(*client.scan_iter(match=store.keys.pattern))
        client.close()


def test_a_new_process_needs_no_ddl_rights_nor_waits_behind_writes_once_the_table_exists(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    """A role granted only the table's rows (PostgreSQL 15 gives no CREATE on ``public`` by default) works, and
    a process's first use does not queue behind an open write transaction on the table, as CREATE INDEX IF NOT
    EXISTS would (and every park behind that)."""
    client = redis_server.client()
    namespace = f"rights-{unique}"
    DelayStore(client, namespace=namespace, far_tier=FarTier.with_horizon(own_postgres.url, HORIZON)).park(
        "made-by-admin", Envelope("ready", b"{}"), delay=3600
    )
    with psycopg.connect(own_postgres.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE rows_only LOGIN")
        admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON delay_broker_far TO rows_only")
        admin.execute("GRANT USAGE, SELECT ON SEQUENCE delay_broker_far_token TO rows_only")
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    rows_only = own_postgres.url.replace("://delay_broker@", "://rows_only@")
    assert rows_only != own_postgres.url
    with psycopg.connect(own_postgres.url) as writer:
        writer.execute("UPDATE delay_broker_far SET name = name")  # a write transaction left open
        store = DelayStore(client, namespace=namespace, far_tier=FarTier.with_horizon(rows_only, HORIZON))
        found: list[Any] = []
        reader = threading.Thread(target=lambda: found.append(store.get("made-by-admin")), daemon=True)
        reader.start()
        reader.join(20)
        assert found and found[0] is not None and found[0].state == "due", "read while the write is open"
        writer.rollback()
    assert store.park("by-rows-only", Envelope("ready", b"{}"), delay=3600).outcome == "new"
    assert store.stats().far == 2
    client.delete(*client.scan_iter(match=store.keys.pattern))
    client.close()


@pytest.mark.slow
def test_sweepers_killed_and_postgresql_restarted_lose_and_duplicate_nothing(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    """Exactly-once path: 4 promoter processes, each a sweeper, SIGKILLed at random (20 kills) while 20,000 far
    messages come within the horizon, and PostgreSQL restarted (immediate stop, as a crash) twice."""
    server = own_postgres
    client = redis_server.client()
    namespace = f"farchaos-{unique}"
    tier = FarTier(server.url, horizon=1.0, sweep_interval=0.1, batch=100, lease=5.0)
    store = DelayStore(client, namespace=namespace, far_tier=tier)
    target = f"{namespace}:ready"
    count, seconds = 20_000, 12.0
    options = ("--far-url", server.url, "--far-horizon", "1.0", "--far-sweep", "0.05", "--far-batch", "100")
    promoters = Promoters(redis_server.url, namespace, target, *options)
    rng = random.Random(13)
    try:
        ids = [f"c{n}" for n in range(count)]
        for start in range(0, count, 1000):
            store.park_many(
                ParkRequest(id, Envelope("ready", id.encode()), delay=1.5 + seconds * (start + k) / count)
                for k, id in enumerate(ids[start : start + 1000])
            )
        assert store.stats().far == count and redis_holds(client, store) == (0, 0)
        for _ in range(4):
            promoters.spawn()
        restarts = 0
        for kill in range(1, 21):
            time.sleep(rng.uniform(0.1, 0.5))
            promoters.kill_one(rng)
            promoters.spawn()
            if kill in (7, 14):  # an immediate stop: PostgreSQL's crash, mid-sweep for some promoter
                server.restart()
                restarts += 1
        wait_for(lambda: client.llen(target) >= count, 90, "every message delivered")
        time.sleep(1.0)
        received = delivered(client, target)
        total, lost, duplicated = figures(received, ids)
        kills = promoters.kills
        print(f"far chaos: {kills=} {restarts=} delivered={total} {lost=} {duplicated=}")
        assert promoters.kills == 20 and restarts == 2
        assert (lost, duplicated) == (0, 0)
        assert store.stats().far == 0
    finally:
        promoters.stop()
        client.delete(target, *client.scan_iter(match=store.keys.pattern))
        client.close()


@pytest.fixture(scope="module")
def dramatiq_far(redis_server: EmbeddedRedis, postgres: PostgresServer) -> Iterator[Deployment]:
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": "redis",
        "DB_REDIS_URL": redis_server.url,
        "DB_BROKER_NS": f"db{unique}",
        "DB_STORE_NS": f"dramatiq-far-{unique}",
        "DB_THRESHOLD": "1.0",
        "DB_RECORD_KEY": f"records:far:{unique}",
        "DB_QUEUES": f"parked_db{unique}",
        "DB_FAR_URL": postgres.url,
        "DB_FAR_HORIZON": str(HORIZON),
    }
    yield from running("redis-far", env, redis_server.url)


def test_a_real_dramatiq_worker_runs_a_far_message_once_after_due(dramatiq_far: Deployment) -> None:
    sent_at = time.time() * 1000
    message = dramatiq_far.actor("parked").send_with_options(args=("far",), delay=int((HORIZON + 2) * 1000))
    info = dramatiq_far.app.middleware.get(message)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert dramatiq_far.app.middleware.store.stats().far == 1  # in PostgreSQL, not Redis
    runs = wait_for(lambda: dramatiq_far.runs("far"), 30, "the far message ran")
    assert runs[0]["t"] >= info.due_ms - 1 and runs[0]["t"] >= sent_at + (HORIZON + 2) * 1000 - 5
    time.sleep(1.0)
    assert len(dramatiq_far.runs("far")) == 1 and runs[0]["id"] == message.message_id


def test_a_far_park_past_max_delay_is_refused_as_in_redis(tiered: Any) -> None:
    store, client, _ = tiered
    limited = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier, max_delay=3600)
    with pytest.raises(InvalidDelay, match=r"too-far is 7200 s from now, beyond max_delay \(3600 s\)"):
        limited.park_many([ParkRequest("ok", Envelope("ready", b"ok"), delay=1800),
                           ParkRequest("too-far", Envelope("ready", b"x"), delay=7200)])  # fmt: skip
    assert limited.stats().parked == 0  # nothing of the batch written, in either tier


def test_a_far_park_replaces_a_copy_a_promoter_holds(tiered: Any) -> None:
    """A Dramatiq retry with a backoff past the horizon re-parks the id while the promoter that delivered it
    holds its lease: the row replaces that copy, as a park in Redis would."""
    store, client, target = tiered
    store.park("retried", Envelope("ready", b"first run"), delay=0)
    claim = store.claim(10, lease=30, promoter_id="p")
    assert store.park("retried", Envelope("ready", b"retry"), delay=HORIZON + 0.5).outcome == "replaced"
    assert store.nack(claim.lease_deadline_ms, [("retried", "broken", "retry")]) == ["not held"]
    stats = store.stats()
    assert (stats.parked, stats.far, stats.inflight, stats.counters["promoted"]) == (1, 1, 0, 1)
    wait_for(lambda: store.sweep_far(), 5, "the retry moved into Redis")
    wait_for(lambda: promote(store, target), 5, "the retry promoted")
    assert client.lrange(target, 0, -1) == [b"retry"] and store.stats().parked == 0


def test_a_cancel_waits_for_a_park_moving_the_id_between_the_tiers(tiered: Any) -> None:
    """A far park of an id parked in Redis is in neither tier between its cancel in Redis and its commit: a
    cancel by another process meeting it there found nothing and left the message to run."""
    store, client, _ = tiered
    store.park("x", Envelope("ready", b"near"), delay=1)  # within the horizon: in Redis, no row
    other = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier)
    assert other.get("warm-up") is None  # its connection made, as a running process's is
    cancel_in_redis = store._parking.cancel
    halfway = threading.Event()

    def then_pause(ids: list[str], *, replacing: bool = False) -> list[bool]:
        gone = cancel_in_redis(ids, replacing=replacing)
        halfway.set()
        time.sleep(1.0)  # the row not committed yet
        return gone

    store._parking.cancel = then_pause  # type: ignore[method-assign]
    parking = threading.Thread(target=lambda: store.park("x", Envelope("ready", b"far"), delay=3600))
    parking.start()
    assert halfway.wait(10)
    assert other.cancel("x") is True, "the cancel met the park half-way"
    parking.join(10)
    assert store.get("x") is None and store.stats().far == 0 and redis_holds(client, store) == (0, 0)


def test_parks_of_one_id_in_two_tiers_at_once_leave_the_later_one(tiered: Any) -> None:
    """A far park and a near park of the same id by two processes: the second waits for the first to finish in
    both tiers, then replaces it, so exactly one copy is left, the second's."""
    store, client, _ = tiered
    other = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier)
    cancel_in_redis = store._parking.cancel
    near: dict[str, Any] = {}

    def row_written_then_other_parks(ids: list[str], *, replacing: bool = False) -> list[bool]:
        # Between the far park's row and its cancel in Redis: the other park must wait for both.
        thread = threading.Thread(
            target=lambda: near.update(result=other.park("x", Envelope("ready", b"near"), delay=1))
        )
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), "the near park of the same id did not wait for the far one"
        near["thread"] = thread
        return cancel_in_redis(ids, replacing=replacing)

    store._parking.cancel = row_written_then_other_parks  # type: ignore[method-assign]
    assert store.park("x", Envelope("ready", b"far"), delay=3600).outcome == "new"
    near["thread"].join(10)
    assert near["result"].outcome == "replaced"
    info = store.get("x")
    assert info is not None and info.raw is not None and info.raw.endswith(b"near")
    stats = store.stats()
    assert (stats.parked, stats.far) == (1, 0) and redis_holds(client, store) == (1, 1)


def test_concurrent_keep_parks_of_the_same_far_ids_tell_one_producer_new(tiered: Any) -> None:
    store, client, _ = tiered
    producers = [DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier) for _ in range(2)]
    outcomes: dict[int, list[str]] = {}

    def produce(number: int) -> None:
        requests = [ParkRequest(f"d{n}", Envelope("ready", b"%d" % number), delay=3600) for n in range(300)]
        outcomes[number] = []
        for start in range(0, 300, 10):
            parked = producers[number].park_many(requests[start : start + 10], on_conflict="keep")
            outcomes[number] += [result.outcome for result in parked]

    threads = [threading.Thread(target=produce, args=(number,)) for number in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    told_new = [[outcomes[number][n] for number in range(2)].count("new") for n in range(300)]
    assert told_new == [1] * 300
    assert store.stats().far == 300


def test_an_id_twice_in_one_batch_is_parked_in_order_across_the_tiers(tiered: Any) -> None:
    store, client, _ = tiered

    def batch(first: float, second: float) -> list[ParkRequest]:
        return [ParkRequest("x", Envelope("ready", b"first"), delay=first),
                ParkRequest("x", Envelope("ready", b"second"), delay=second)]  # fmt: skip

    assert [r.outcome for r in store.park_many(batch(3600, 1))] == ["new", "replaced"]
    assert store.get("x").raw.endswith(b"second") and store.stats().far == 0  # type: ignore[union-attr]
    assert store.cancel("x")
    assert [r.outcome for r in store.park_many(batch(1, 3600), on_conflict="keep")] == ["new", "kept"]
    assert store.get("x").raw.endswith(b"first") and store.stats().far == 0  # type: ignore[union-attr]
    assert redis_holds(client, store) == (1, 1)


def test_stats_and_listings_see_each_message_once_while_rows_move(tiered: Any) -> None:
    store, client, _ = tiered
    count = 4000
    for start in range(0, count, 1000):
        store.park_many(
            ParkRequest(f"m{n}", Envelope("ready", b"m"), delay=HORIZON + 0.3) for n in range(start, start + 1000)
        )
    sweeper = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier)
    time.sleep(0.5)
    done = threading.Event()

    def sweep() -> None:
        while sweeper.sweep_far():
            pass
        done.set()

    threading.Thread(target=sweep, daemon=True).start()
    parked, listed = [], []
    while not done.is_set():
        parked.append(store.stats().parked)
        listed.append(len({info.id for info in store.list_messages(count=1000, offset=count - 1000)}))
    assert len(parked) > 3, "the sweep ended before it could be watched: make it longer"
    # Never missed; counted twice only when a sweeper commits a batch and drops its tokens in the instant
    # between the two reads of stats (see DelayStore._far_view), so a few polls at most, each one batch over.
    assert set(listed) == {1000} and min(parked) == count and max(parked) <= count + store.far_tier.batch
    assert parked.count(count) >= len(parked) // 2
    assert store.stats().far == 0 and redis_holds(client, store) == (count, count)


def test_the_first_parks_after_postgresql_restarted_succeed(
    redis_server: EmbeddedRedis, own_postgres: PostgresServer, unique: str
) -> None:
    server = own_postgres
    client = redis_server.client()
    store = DelayStore(
        client, namespace=f"pgrestart-{unique}", far_tier=FarTier(server.url, horizon=HORIZON, sweep_interval=0.2)
    )
    try:
        store.park("far", Envelope("ready", b"far"), delay=3600)
        server.restart()  # every connection the store holds is now broken
        assert store.park("near", Envelope("ready", b"near"), delay=1).outcome == "new"
        server.restart()
        assert store.sweep_far() == 0
        assert store.park("far-2", Envelope("ready", b"far"), delay=3600).outcome == "new"
        assert store.stats().far == 2
    finally:
        client.delete(*client.scan_iter(match=store.keys.pattern))
        client.close()


def test_an_id_postgresql_cannot_hold_is_refused_for_the_far_tier_only(tiered: Any) -> None:
    store, _, _ = tiered
    with pytest.raises(InvalidMessage, match="NUL character"):
        store.park_many([ParkRequest("fine", Envelope("ready", b"f"), delay=3600),
                         ParkRequest("nul\x00id", Envelope("ready", b"n"), delay=3600)])  # fmt: skip
    assert store.stats().parked == 0  # refused before anything was written
    assert store.park("nul\x00id", Envelope("ready", b"n"), delay=1).outcome == "new"  # Redis holds it
    assert store.get("nul\x00id") is not None and store.reschedule("nul\x00id", delay=2) is not None
    assert store.cancel("nul\x00id") and store.get("nul\x00id") is None


def test_overdue_rows_are_in_no_bucket_of_the_histogram(tiered: Any) -> None:
    store, _, _ = tiered
    store.park("late", Envelope("ready", b"l"), delay=HORIZON + 0.2)
    store.park("later", Envelope("ready", b"l"), delay=HORIZON + 120)
    time.sleep(HORIZON + 0.4)  # due now, not yet swept
    stats = store.stats()
    assert (stats.far, stats.overdue, stats.histogram) == (2, 1, [0, 1, 0, 0])


def test_the_cli_sees_both_tiers_when_given_the_far_tier(tiered: Any, postgres: PostgresServer) -> None:
    store, client, _ = tiered
    store.park("near", Envelope("ready", b"n"), delay=1)
    store.park("far", Envelope("ready", b"f"), delay=7200)
    url = client.connection_pool.connection_kwargs
    environment = {
        "DELAY_BROKER_REDIS_URL": f"redis://{url['host']}:{url['port']}/0",
        "DELAY_BROKER_NAMESPACE": store.keys.namespace,
        "DELAY_BROKER_FAR_TIER": postgres.url,
    }

    def run(*args: str, tier: bool = True) -> Any:
        env: dict[str, str | None] = environment if tier else {**environment, "DELAY_BROKER_FAR_TIER": None}
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout) if "--json" in args else result.stdout

    assert [m["id"] for m in run("ls", "--json")["messages"]] == ["near", "far"]
    assert [m["id"] for m in run("ls", "--json", tier=False)["messages"]] == ["near"]  # without it, Redis alone
    stats = run("stats", "--json")
    assert (stats["parked"], stats["far"]) == (2, 1)
    assert "1 of them in the far tier" in run("stats")
    assert run("show", "far", "--json")["state"] == "due"
    run("reschedule", "far", "--in", "30s", "--far-horizon", "60", "--yes")  # within that horizon: into Redis
    assert store.stats().far == 0 and redis_holds(client, store) == (2, 2)
    store.park("far", Envelope("ready", b"f"), delay=7200)
    run("cancel", "far", "--yes")
    assert store.get("far") is None and store.stats().parked == 1


def test_the_metrics_command_counts_the_far_tier_when_given_it(tiered: Any, postgres: PostgresServer) -> None:
    """``delay-broker metrics`` takes the far tier as the other commands do (option or environment), and its
    gauges then count the rows in PostgreSQL as parked."""
    store, client, _ = tiered
    store.park("near", Envelope("ready", b"n"), delay=1)  # within HORIZON: in Redis
    for n in range(3):
        store.park(f"far-{n}", Envelope("ready", b"f"), delay=7 * 86400)
    url = client.connection_pool.connection_kwargs
    namespace = store.keys.namespace
    environment = {"DELAY_BROKER_REDIS_URL": f"redis://{url['host']}:{url['port']}/0", "DELAY_BROKER_NAMESPACE": None}

    def parked(*args: str, env: dict[str, str | None] | None = None) -> str:
        scrape = CliRunner().invoke(
            cli, ["metrics", "--print", "-n", namespace, *args], env={**environment, **(env or {})}
        )
        assert scrape.exit_code == 0, scrape.output
        return next(line for line in scrape.stdout.splitlines() if line.startswith("delay_broker_parked_messages"))

    assert parked() == f'delay_broker_parked_messages{{namespace="{namespace}"}} 1.0', "without it, Redis alone"
    assert parked("--far-tier", postgres.url).endswith(" 4.0")
    assert parked(env={"DELAY_BROKER_FAR_TIER": postgres.url, "DELAY_BROKER_FAR_HORIZON": "60"}).endswith(" 4.0")


def test_a_park_that_fails_in_redis_gives_its_locks_back(tiered: Any) -> None:
    store, client, _ = tiered
    client.set(store.keys.due, "not a sorted set")  # the Redis half of the far park is refused
    with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
        store.park("x", Envelope("ready", b"far"), delay=3600)
    client.delete(store.keys.due)
    other = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier)  # its own connection
    parked: list[Any] = []
    thread = threading.Thread(
        target=lambda: parked.append(other.park("x", Envelope("ready", b"near"), delay=1)), daemon=True
    )
    thread.start()
    thread.join(10)
    assert parked and parked[0].outcome == "new", "the failed park's locks were given back, and it left no row"
    assert store.stats().far == 0 and redis_holds(client, store) == (1, 1)


@pytest.mark.parametrize("on_conflict", ["replace", "keep"])
def test_a_far_park_that_raises_because_redis_is_down_leaves_no_row(postgres: PostgresServer, on_conflict: str):
    # The caller is told the park failed, and may hand the message elsewhere (a Dramatiq retry goes to the
    # broker): a row left behind would run it a second time.
    server = EmbeddedRedis().start()
    tier = FarTier(postgres.url, horizon=HORIZON, sweep_interval=0.1)
    store = DelayStore(server.client(), namespace=f"far-down-{uuid.uuid4().hex[:8]}", far_tier=tier)
    try:
        store.park("warm-up", Envelope("ready", b"x"), delay=3600)  # layout and clock read while Redis is up
        server.stop()
        with pytest.raises(StoreUnavailable):
            store.park("job", Envelope("ready", b"x"), delay=3600, on_conflict=on_conflict)  # type: ignore[arg-type]
        assert store._tier.table is not None and store._tier.table.get("job") is None
        assert store._tier.table.get("warm-up") is not None
    finally:
        server.close()
        with psycopg.connect(postgres.url, autocommit=True) as connection:
            connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (store._tier.table.namespace,))  # type: ignore[union-attr]


def test_finds_counts_and_bulk_actions_see_a_message_moving_in_once(tiered: Any) -> None:
    store, client, _ = tiered
    sweeper = DelayStore(client, namespace=store.keys.namespace, far_tier=store.far_tier)  # another promoter
    store.park_many(ParkRequest(f"a{n}", Envelope("q", b"x"), delay=3600 + n) for n in range(3))
    assert store._tier.table is not None
    for n in range(3):  # as if an hour had gone by: within the horizon, for the next sweep
        store._tier.table.reschedule(f"a{n}", store.now_ms() + 1500, None, "", "")
    real_scan_far = store.scan_far

    def sweep_first(**arguments: Any) -> Any:  # the other promoter's sweep commits between the two reads
        store.scan_far = real_scan_far  # type: ignore[method-assign]
        assert sweeper.sweep_far() == 3
        return real_scan_far(**arguments)

    store.scan_far = sweep_first  # type: ignore[method-assign]
    result = Operations(store).cancel(filter=MessageFilter(queue="q"))
    assert (result.matched, result.done) == (3, 3), "the moved messages were missed by the filtered cancel"
    assert store.list_messages() == []

    store.park("b", Envelope("q", b"x"), delay=HORIZON + 0.5)
    now = store.now_ms()

    def adopt_then_die(rows: list[FarRow]) -> None:
        store._tier.sweeper.adopt(rows, now + 5000)
        raise KeyboardInterrupt  # its transaction never commits: the row stays, its copy is in Redis

    with pytest.raises(KeyboardInterrupt):
        store._tier.table.move(now + 10_000, 100, 5000, adopt_then_die)
    operations = Operations(store)
    assert [info.id for info in operations.find(MessageFilter()).messages] == ["b"]
    assert operations.count(MessageFilter()).matched == 1
    assert [info.id for info in operations.matches(MessageFilter())] == ["b"]


def test_a_real_celery_worker_runs_a_far_task_once_after_due(
    request: pytest.FixtureRequest, postgres: PostgresServer, unique: str
) -> None:
    """Celery with the tier in its transport options: the worker's promoter sweeps it, and the adapter's
    cancel reaches a far task."""
    env = env_for("redis", request, unique, options={"far_tier": postgres.url, "far_horizon": HORIZON})
    store = DelayStore(env.store_client, namespace=env.store.keys.namespace, far_tier=FarTier(postgres.url))
    try:
        env.start_worker("w1")
        sent_at = time.time()
        result = env.task("record").apply_async(("far",), countdown=HORIZON + 3)
        cancelled = env.task("record").apply_async(("cancelled",), countdown=HORIZON + 3)
        info = store.get(result.id)
        assert info is not None and info.due_ms is not None and store.stats().far == 2  # in PostgreSQL
        assert celery_cancel(env.app, cancelled.id) and store.stats().far == 1
        wait_for(lambda: env.runs(result.id), 30, "the far task ran")
        run = env.runs(result.id)[0]
        assert run["t"] >= info.due_ms / 1000 - 0.05 and run["t"] >= sent_at + HORIZON + 3 - 0.5
        time.sleep(1.5)
        assert len(env.runs(result.id)) == 1 and env.runs(cancelled.id) == []
        assert store.stats().far == 0 and store.stats().parked == 0
    finally:
        env.close()
