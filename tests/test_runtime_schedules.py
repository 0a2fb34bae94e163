"""Schedules managed at runtime, on a real redis-server: add, change, pause, resume, run now, remove; every=
intervals, start and end dates, missed runs; each occurrence once with several promoters."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
import redis

from delay_broker import DelayStore, RuntimeSchedules, ScheduleNotFound
from delay_broker.cron import CATCH_UP_MS, CronScheduler, Schedule
from delay_broker.deliverers import DirectLists
from delay_broker.envelope import Envelope
from delay_broker.errors import ConfigurationError
from delay_broker.promoter import Promoter
from delay_broker.schedule_defs import (
    CorruptSchedule,
    ScheduledCall,
    ScheduleDefinition,
    occurrence_id,
    run_now_record,
)
from delay_broker.targets import ListTarget
from delay_broker.timing import Timing

from .helpers import wait_for


def builder(call: ScheduledCall):
    """What an adapter does, in miniature: the call's task and args, the occurrence's id and due time."""

    def build(id: str, due: datetime) -> Envelope:
        body = {"task": call.task, "args": list(call.args), "id": id, "due": int(due.timestamp() * 1000)}
        return Envelope(route="ready", payload=json.dumps(body).encode())

    return build


def runs(client: redis.Redis, key: str) -> list[dict]:
    return [json.loads(item) for item in client.lrange(key, 0, -1)]


def promoters(store: DelayStore, ready_key: str, count: int, **options) -> list[Promoter]:
    deliverer = DirectLists({"ready": ListTarget(ready_key, mode="rpush")})
    return [
        Promoter(store, deliverer, cron=CronScheduler(store, builder=builder, **options), max_idle=1).start()
        for _ in range(count)
    ]


def stop(running: list[Promoter]) -> None:
    for promoter in running:
        promoter.stop()


# -- timing ------------------------------------------------------------------------------------------------------


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_an_interval_counts_from_the_epoch_or_from_its_start_and_stops_at_its_end():
    hourly = Timing.create(every=3600)
    assert hourly.next_after(at("2026-03-01T10:20:00+00:00")) == at("2026-03-01T11:00:00+00:00")
    assert hourly.next_after(at("2026-03-01T11:00:00+00:00")) == at("2026-03-01T12:00:00+00:00")
    start = datetime(2026, 3, 1, 10, 7, tzinfo=timezone.utc)
    bounded = Timing.create(every=timedelta(minutes=30), start=start, end=start + timedelta(hours=1))
    assert bounded.next_after(at("2026-01-01T00:00:00+00:00")) == at("2026-03-01T10:07:00+00:00"), "not before start"
    assert bounded.next_after(at("2026-03-01T10:07:00+00:00")) == at("2026-03-01T10:37:00+00:00")
    assert bounded.next_after(at("2026-03-01T10:37:00+00:00")) == at("2026-03-01T11:07:00+00:00"), "end is inclusive"
    assert bounded.next_after(at("2026-03-01T11:07:00+00:00")) is None, "ended"
    assert bounded.count_between(at("2026-03-01T00:00:00+00:00"), at("2026-03-02T00:00:00+00:00")) == 3
    weekdays = Timing.create(cron="0 9 * * 1-5", timezone="Europe/Paris", start=start)
    # Friday 2026-03-06 to Monday 2026-03-09: the weekend is not counted.
    assert weekdays.count_between(at("2026-03-06T00:00:00+00:00"), at("2026-03-09T23:00:00+00:00")) == 2


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({}, "either cron= or every="),
        ({"cron": "* * * * *", "every": 60}, "either cron= or every="),
        ({"every": 0.5}, "at least 1 s"),
        ({"every": -5}, "must not be negative"),
        ({"every": float("nan")}, "NaN"),
        ({"every": "1h"}, "number of seconds or a timedelta"),
        ({"cron": "* * * * *", "start": datetime(2026, 1, 1)}, "timezone-aware"),
        (
            {
                "every": 60,
                "start": datetime(2026, 2, 1, tzinfo=timezone.utc),
                "end": datetime(2026, 1, 1, tzinfo=timezone.utc),
            },
            "before start",
        ),
    ],
)
def test_a_bad_timing_is_refused_with_what_is_wrong(options, problem):
    with pytest.raises(ConfigurationError, match=problem):
        Timing.create(**options)


def test_a_declared_schedule_takes_every_and_dates_too(store: DelayStore):
    schedule = Schedule.create("tick", None, builder(ScheduledCall("t")), every=10)
    assert schedule.next_after(5_000) == 10_000 and schedule.timing.describe() == "every 10 s"
    with pytest.raises(ConfigurationError, match=r"schedule 'tick': .*either cron= or every="):
        Schedule.create("tick", None, builder(ScheduledCall("t")))
    with pytest.raises(ConfigurationError, match="control characters"):
        Schedule.create("tick\x1f", "* * * * *", builder(ScheduledCall("t")))


# -- stored definitions -------------------------------------------------------------------------------------------


def test_a_definition_is_stored_as_json_and_read_back_checked():
    timing = Timing.create(cron="0 9 * * 1-5", timezone="Europe/Paris", end=datetime(2030, 1, 1, tzinfo=timezone.utc))
    definition = ScheduleDefinition(
        "report", timing, ScheduledCall.create("send_report", [1, "x"], {"to": "ops"}, {"queue": "reports"}), True, (5,)
    )
    raw = definition.encode()
    assert json.loads(raw)["timing"]["timezone"] == "Europe/Paris"
    assert ScheduleDefinition.decode("report", raw) == definition
    for spoiled in (
        b"not json",
        b"[]",
        b'{"format": 99}',
        b'{"format": 1, "timing": {"cron": "61 * * * *", "every_ms": null, "timezone": "UTC", "start_ms": null, '
        b'"end_ms": null}}',
        b'{"format": 1, "call": {"task": "x", "args": "__import__(\'os\')"}}',
        b'{"format": 1, "runs": ["soon"]}',
        b'{"format": 1, "call": {"task": "x", "unknown": 1}}',
    ):
        with pytest.raises(CorruptSchedule, match="stored schedule 'report' cannot be read"):
            ScheduleDefinition.decode("report", spoiled)


def test_a_call_must_be_json_and_leave_the_ids_and_eta_to_the_schedule():
    with pytest.raises(ConfigurationError, match="must be JSON"):
        ScheduledCall.create("t", [object()])
    with pytest.raises(ConfigurationError, match="'eta' is set by the schedule"):
        ScheduledCall.create("t", options={"eta": "2030-01-01"})
    with pytest.raises(ConfigurationError, match="args must be a list"):
        ScheduledCall.create("t", "abc")


def test_add_refuses_a_name_taken_and_change_keeps_what_is_not_given(store: DelayStore):
    schedules = RuntimeSchedules(store)
    schedules.add("report", "send_report", cron="0 9 * * *", args=[1], kwargs={"to": "ops"})
    with pytest.raises(ConfigurationError, match="already stored"):
        schedules.add("report", "other", every=60)
    changed = schedules.change("report", every=3600, args=[2])
    assert changed.timing is not None and changed.timing.every_ms == 3_600_000 and changed.timing.cron is None
    assert changed.call == ScheduledCall("send_report", (2,), {"to": "ops"}, {})
    assert schedules.get("report") == changed
    with pytest.raises(ScheduleNotFound, match="no schedule 'missing'"):
        schedules.pause("missing")
    assert schedules.remove("report") and schedules.get("report") is None and not schedules.remove("report")


def test_the_overview_shows_no_occurrence_until_one_is_parked_after_a_change(store: DelayStore):
    """A change rewinds the schedule's record to now (so the next occurrence is the first after the change): that
    is no occurrence, and cron ls / the dashboard must not show it as one that ran."""
    from delay_broker.schedules import schedule_rows

    schedules = RuntimeSchedules(store)
    schedules.add("nightly", "send_report", every=3600)
    [row] = schedule_rows(store)
    assert (row["due_ms"], row["id"], row["state"]) == (None, None, "none parked")
    scheduler = CronScheduler(store, builder=builder)
    assert scheduler.run_pending() == 1
    [row] = schedule_rows(store)
    assert row["state"] == "parked" and row["due_ms"] is not None and store.get(row["id"]) is not None
    schedules.change("nightly", every=7200)  # cancels the parked occurrence and rewinds again
    [row] = schedule_rows(store)
    assert (row["due_ms"], row["state"]) == (None, "none parked")
    schedules.remove("nightly")
    assert schedule_rows(store) == [], "the marker goes with the schedule"


def test_a_check_refuses_a_call_before_anything_is_stored(store: DelayStore):
    def no_such_actor(call: ScheduledCall) -> None:
        raise ConfigurationError(f"no actor named {call.task!r}")

    with pytest.raises(ConfigurationError, match="no actor named 'typo'"):
        RuntimeSchedules(store, check=no_such_actor).add("report", "typo", every=60)
    assert store.stored_schedules().definitions == {}


def test_an_occurrence_built_from_changed_schedules_is_refused_as_stale(store: DelayStore):
    revision = store.schedules_revision()
    RuntimeSchedules(store).add("report", "send_report", every=60)
    due = datetime.now(timezone.utc) + timedelta(minutes=1)
    envelope = Envelope(route="ready", payload=b"x")
    stale = store.park_occurrence("report", "r1", envelope, due, revision=revision)
    assert stale.outcome == "stale" and store.get("r1") is None and "report" in store.schedules()
    fresh = store.park_occurrence("report", "r1", envelope, due, revision=store.schedules_revision())
    assert fresh.outcome == "new"


# -- promoters run them ---------------------------------------------------------------------------------------------


def test_three_promoters_run_a_stored_schedule_once_per_occurrence_through_every_change(store, client, ready_key):
    schedules = RuntimeSchedules(store)
    running = promoters(store, ready_key, 3)
    try:
        schedules.add("tick", "tick_task", every=1, args=["a"])
        wait_for(lambda: len(runs(client, ready_key)) >= 3, timeout=20)

        # Paused: the parked occurrence is cancelled and nothing more runs.
        paused = schedules.pause("tick")
        assert paused.paused
        time.sleep(0.3)  # one occurrence may have been promoted as the pause was written
        count = len(runs(client, ready_key))
        time.sleep(2.5)
        assert len(runs(client, ready_key)) == count, "nothing runs while paused"
        assert store.stats().parked == 0

        # Run now works while paused, once, whatever the number of promoters.
        id = schedules.run_now("tick")
        wait_for(lambda: any(run["id"] == id for run in runs(client, ready_key)), timeout=10)

        # Resumed: from the first occurrence after now; those that fell in the pause are not made up.
        resumed_at = store.now_ms()
        schedules.resume("tick")
        wait_for(lambda: len(runs(client, ready_key)) >= count + 3, timeout=20)

        # Changed: the next occurrences follow the new interval and send the new arguments.
        changed_at = store.now_ms()
        schedules.change("tick", every=2, args=["b"])
        wait_for(lambda: sum(run["args"] == ["b"] for run in runs(client, ready_key)) >= 2, timeout=20)

        schedules.remove("tick")
        time.sleep(0.3)
        count = len(runs(client, ready_key))
        time.sleep(2.5)
        assert len(runs(client, ready_key)) == count, "nothing runs once removed"
    finally:
        stop(running)
    done = runs(client, ready_key)
    ids = Counter(run["id"] for run in done)
    assert ids.most_common(1)[0][1] == 1, f"an occurrence ran twice: {ids.most_common(2)}"
    assert [run["id"] for run in done].count(id) == 1
    regular = [run for run in done if run["id"] != id]
    for run in regular:
        assert run["id"] == occurrence_id(store.keys.namespace, "tick", run["due"]), "the id every process derives"
    assert all(run["due"] % 1000 == 0 for run in regular if run["args"] == ["a"])
    assert all(run["due"] % 2000 == 0 and run["due"] > changed_at for run in regular if run["args"] == ["b"])
    during_pause = [run for run in regular if paused.updated_ms + 1000 < run["due"] <= resumed_at]
    assert during_pause == [], "occurrences that fell in the pause were not made up"
    assert store.stats().parked == 0 and "tick" not in store.schedules()


def test_a_schedule_declared_in_code_is_paused_retimed_and_run_now_at_runtime(store, client, ready_key):
    declared = Schedule.create("nightly", "0 3 * * *", builder(ScheduledCall("nightly_task")))
    deliverer = DirectLists({"ready": ListTarget(ready_key, mode="rpush")})
    promoter = Promoter(store, deliverer, cron=CronScheduler(store, [declared], builder=builder), max_idle=1).start()
    schedules = RuntimeSchedules(store)
    try:
        wait_for(lambda: "nightly" in store.schedules(), timeout=10)
        nightly = store.schedules()["nightly"]
        assert nightly is not None and nightly > store.now_ms(), "next 03:00 is parked"

        overridden = schedules.change("nightly", every=1)
        assert overridden.call is None, "the code's message is kept"
        assert store.get(occurrence_id(store.keys.namespace, "nightly", nightly)) is None, "old occurrence cancelled"
        wait_for(lambda: len(runs(client, ready_key)) >= 2, timeout=20)
        assert all(run["task"] == "nightly_task" for run in runs(client, ready_key))

        schedules.pause("nightly")
        id = schedules.run_now("nightly")
        wait_for(lambda: any(run["id"] == id for run in runs(client, ready_key)), timeout=10)
        assert id == occurrence_id(store.keys.namespace, run_now_record("nightly"), runs(client, ready_key)[-1]["due"])

        # Removing the override: the code's timing again, from its next occurrence.
        schedules.remove("nightly")
        wait_for(lambda: (store.schedules().get("nightly") or 0) > store.now_ms() + 60_000, timeout=10)
    finally:
        promoter.stop()


def test_a_schedule_declared_here_is_paused_before_any_promoter_parked_it(store, client, ready_key):
    """A deploy script pauses a code schedule first thing: the name is known from this process's declarations."""
    declared = Schedule.create("digest", "* * * * *", builder(ScheduledCall("digest_task")))
    with pytest.raises(ScheduleNotFound, match="none is declared in this process's code"):
        RuntimeSchedules(store).pause("digest")
    paused = RuntimeSchedules(store, declared=lambda: {"digest": declared}).pause("digest")
    assert paused.paused and paused.timing is None and paused.call is None  # the code's, paused
    deliverer = DirectLists({"ready": ListTarget(ready_key, mode="rpush")})
    promoter = Promoter(store, deliverer, cron=CronScheduler(store, [declared], builder=builder), max_idle=0.2)
    promoter.start()
    try:
        time.sleep(1.0)
        assert "digest" not in store.schedules() and store.stats().parked == 0, "a paused schedule parks nothing"
    finally:
        promoter.stop()


def test_occurrences_missed_while_no_promoter_ran_are_logged_and_counted(store, caplog):
    RuntimeSchedules(store).add("minutely", "t", every=60)
    missed: list[tuple[str, int]] = []
    # As if every promoter had been down for ten minutes: the last occurrence parked is ten minutes old.
    store.client.hset(store.keys.cron, "minutely", store.now_ms() // 60_000 * 60_000 - 10 * 60_000)
    fresh = CronScheduler(store, builder=builder, on_missed=lambda name, count: missed.append((name, count)))
    with caplog.at_level(logging.WARNING, logger="delay_broker.cron"):
        assert fresh.run_pending() == 1
    assert missed and missed[0][0] == "minutely" and 9 <= missed[0][1] <= 10
    assert any("were missed" in record.getMessage() for record in caplog.records)
    again = CronScheduler(store, builder=builder, on_missed=lambda name, count: missed.append((name, count)))
    again.run_pending()
    assert len(missed) == 1, "counted once, by the promoter that resumed it"
    assert CATCH_UP_MS == 60_000


def test_after_a_long_outage_the_occurrences_of_the_last_minute_still_run(store, caplog):
    """Down 80 s with a 5 s schedule: the occurrences older than a minute are skipped (and counted), the dozen
    of the last minute run late, one after the other, rather than none of them."""
    RuntimeSchedules(store).add("often", "t", every=5)
    now = store.now_ms()
    store.client.hset(store.keys.cron, "often", now // 5000 * 5000 - 80_000)
    missed: list[int] = []
    scheduler = CronScheduler(store, builder=builder, on_missed=lambda name, count: missed.append(count))
    parked = 0
    with caplog.at_level(logging.WARNING, logger="delay_broker.cron"):
        for _ in range(40):  # as a promoter's steps do, one occurrence each while they are past
            parked += scheduler.run_pending()
            time.sleep(0.005)
    late = [info for info in store.iter_all("due") if info.due_ms is not None and info.due_ms <= store.now_ms()]
    assert 11 <= len(late) <= 13 and parked >= len(late)
    assert all(info.due_ms >= now - CATCH_UP_MS - 5 for info in late), "none older than the window"
    assert len(missed) == 1 and 3 <= missed[0] <= 4


def test_forgetting_a_record_restarts_the_schedule_at_once(store):
    """`cron forget` after a code change (monthly to every second): running schedulers must drop the record they
    hold at once, not go on from it for a minute."""
    every_second = Schedule.create("job", None, builder(ScheduledCall("t")), every=1)
    store.client.hset(store.keys.cron, "job", store.now_ms() + 30 * 86_400_000)  # as the monthly timing left it
    scheduler = CronScheduler(store, [every_second], builder=builder)
    assert scheduler.run_pending() == 0, "held back by the record"
    assert store.forget_schedule("job")
    parked = 0
    for _ in range(30):  # a promoter's steps, woken by the forget
        parked += scheduler.run_pending()
        if parked:
            break
        time.sleep(min(0.1, scheduler.seconds_until_due() + 0.01))
    assert parked == 1
    assert store.client.llen(store.keys.wake) >= 1, "a sleeping promoter is woken"


def test_a_change_right_after_a_read_is_seen_within_the_read_interval(store):
    """A change wakes a promoter; when that wake comes less than REVISION_CHECK_S after the scheduler last read
    the revision, the read is put off, and the promoter must then sleep only until it may read again (not its
    max_idle): `cron pause X && cron run-now X` took 5 s."""
    from delay_broker.cron import REVISION_CHECK_S

    schedules = RuntimeSchedules(store)
    schedules.add("yearly", "t", cron="0 0 1 1 *")
    scheduler = CronScheduler(store, builder=builder)
    scheduler.run_pending()
    scheduler.run_pending()  # reads the revision: nothing changed
    schedules.pause("yearly")
    scheduler.run_pending()  # woken at once by the change: too soon to read again
    assert scheduler.seconds_until_due() <= REVISION_CHECK_S


def test_counting_missed_cron_occurrences_stops_at_a_thousand():
    """A per-second cron down for a month: counting 2.6 million occurrences one by one held a promoter's thread
    for seconds. The count stops at COUNT_LIMIT and is reported as "at least" that."""
    from delay_broker.timing import COUNT_LIMIT

    every_second = Timing.create(cron="* * * * * *")
    assert COUNT_LIMIT == 1000
    assert every_second.count_between(at("2026-01-01T00:00:00+00:00"), at("2026-02-01T00:00:00+00:00")) == 1000
    assert Timing.create(every=1).count_between(0, 86_400_000) == 86_399, "intervals are counted exactly"


def test_a_promoter_counts_missed_occurrences_in_its_metrics(store, ready_key):
    from prometheus_client import CollectorRegistry

    from delay_broker.metrics import PromoterMetrics

    RuntimeSchedules(store).add("minutely", "t", every=60)
    store.client.hset(store.keys.cron, "minutely", store.now_ms() // 60_000 * 60_000 - 5 * 60_000)
    registry = CollectorRegistry()
    promoter = Promoter(
        store,
        DirectLists({"ready": ListTarget(ready_key)}),
        cron=CronScheduler(store, builder=builder),
        listener=PromoterMetrics.for_store(store, registry),
    )
    promoter.step()
    labels = {"namespace": store.keys.namespace, "schedule": "minutely"}
    missed = registry.get_sample_value("delay_broker_schedule_missed_occurrences_total", labels)
    assert missed is not None and 4 <= missed <= 5 and promoter.counters.missed == missed


def test_a_schedule_past_its_end_parks_nothing_and_says_so_once(store, caplog):
    end = datetime.now(timezone.utc) - timedelta(minutes=5)
    RuntimeSchedules(store).add("over", "t", every=60, end=end)
    scheduler = CronScheduler(store, builder=builder)
    with caplog.at_level(logging.INFO, logger="delay_broker.cron"):
        assert scheduler.run_pending() == 0
        scheduler._next_check = 0.0
        assert scheduler.run_pending() == 0
    assert store.stats().parked == 0
    assert [r.getMessage() for r in caplog.records].count(
        "Schedule 'over' has ended (its end date is past): nothing more is parked."
    ) == 1


def test_an_unreadable_definition_is_reported_and_the_others_still_run(store, client, caplog):
    RuntimeSchedules(store).add("good", "t", every=60)
    client.hset(store.keys.schedules, "bad", b"{not json")
    client.incr(store.keys.schedules_rev)
    with caplog.at_level(logging.ERROR, logger="delay_broker.cron"):
        assert CronScheduler(store, builder=builder).run_pending() == 1
    assert any("stored schedule 'bad' cannot be read" in r.getMessage() for r in caplog.records)
    assert set(store.schedules()) == {"good"}


def test_a_promoter_without_a_builder_leaves_stored_calls_to_those_that_have_one(store):
    RuntimeSchedules(store).add("elsewhere", "t", every=60)
    assert CronScheduler(store).run_pending() == 0 and store.stats().parked == 0


# -- unreadable definitions ----------------------------------------------------------------------------------------

SPOILED = {
    "updated_ms too large": b'{"format": 1, "updated_ms": 1e999}',
    "nested too deep for json": b'{"format": 1, "call": {"task": "t", "args": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
    "a zone that is a directory": b'{"format": 1, "timing": {"cron": "0 * * * *", "timezone": "America"}}',
    "a zone name too long for a file": b'{"format": 1, "timing": {"cron": "0 * * * *", "timezone": "'
    + b"a" * 300
    + b'"}}',
}


@pytest.mark.parametrize("raw", SPOILED.values(), ids=SPOILED.keys())
def test_a_definition_that_fails_to_decode_in_any_way_is_corrupt_not_a_crash(raw: bytes):
    with pytest.raises(CorruptSchedule, match=r"stored schedule 'report' cannot be read: .*cron remove report"):
        ScheduleDefinition.decode("report", raw)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_arguments_nested_deeper_than_any_reader_can_read_are_refused_when_added(store: DelayStore):
    schedules = RuntimeSchedules(store)
    for depth in (101, 988, 5000):
        with pytest.raises(ConfigurationError, match="nested more than 100 levels"):
            schedules.add("deep", "t", every=60, args=[nested(depth - 1)])
    with pytest.raises(ConfigurationError, match="kwargs are nested"):
        schedules.add("deep", "t", every=60, kwargs={"a": nested(100)})
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ConfigurationError, match="nested more than"):
        schedules.add("deep", "t", every=60, args=cyclic)
    assert store.stored_schedules().definitions == {}
    fits = schedules.add("deep", "t", every=60, args=[nested(99)])
    assert schedules.get("deep") == fits


def test_a_definition_an_earlier_release_stored_deeper_than_the_limit_still_reads(store: DelayStore, client):
    """The limit guards new definitions; one stored before it (150 levels, which JSON reads) keeps running."""
    schedules = RuntimeSchedules(store)
    schedules.add("deep", "t", every=60, args=[nested(50)])
    raw = client.hget(store.keys.schedules, "deep")
    deeper = raw.replace(b"[" * 51, b"[" * 151).replace(b"]" * 51, b"]" * 151)
    client.hset(store.keys.schedules, "deep", deeper)
    client.incr(store.keys.schedules_rev)
    definition = schedules.get("deep")
    assert definition is not None and definition.call is not None


def test_an_unreadable_definition_stops_neither_the_other_schedules_nor_the_promotion(store, client, ready_key):
    RuntimeSchedules(store).add("good", "good_task", every=1)
    client.hset(store.keys.schedules, "bad", SPOILED["updated_ms too large"])
    client.incr(store.keys.schedules_rev)
    running = promoters(store, ready_key, 2)
    try:
        store.park("plain", Envelope(route="ready", payload=b'{"task": "plain"}'), delay=0)
        wait_for(lambda: {run["task"] for run in runs(client, ready_key)} == {"plain", "good_task"}, timeout=10)
    finally:
        stop(running)
    assert all(promoter.counters.errors == 0 for promoter in running)


def test_an_unreadable_definition_is_listed_with_its_problem_and_can_be_removed(store, client, redis_server, namespace):
    from click.testing import CliRunner

    from delay_broker.cli import cli
    from delay_broker.schedules import schedule_rows

    client.hset(store.keys.schedules, "spoiled", SPOILED["updated_ms too large"])
    schedules = RuntimeSchedules(store)
    assert schedules.all() == {}
    [row] = schedule_rows(store)
    assert row["name"] == "spoiled" and "cannot be read" in row["problem"]
    with pytest.raises(CorruptSchedule, match="'delay-broker cron remove spoiled' deletes it"):
        schedules.pause("spoiled")

    runner = CliRunner()
    env = {"DELAY_BROKER_REDIS_URL": redis_server.url, "DELAY_BROKER_NAMESPACE": namespace}

    def run(*args: str):
        return runner.invoke(cli, ["cron", *args], env=env, catch_exceptions=False)

    listed = run("ls")
    assert listed.exit_code == 0 and "spoiled" in listed.output and "cannot be read" in listed.output
    paused = run("pause", "spoiled")
    assert paused.exit_code == 1 and "cron remove spoiled" in paused.output
    assert len(paused.output.strip().splitlines()) == 1, "one line, no traceback"
    removed = run("remove", "spoiled", "--yes")
    assert removed.exit_code == 0 and "Removed schedule 'spoiled'" in removed.output
    assert store.stored_schedules().definitions == {}


# -- resume, and the record under a parked occurrence ----------------------------------------------------------------


def test_resuming_a_schedule_that_is_not_paused_changes_nothing(store: DelayStore):
    schedules = RuntimeSchedules(store)
    schedules.add("report", "send_report", every=60)
    assert CronScheduler(store, builder=builder).run_pending() == 1
    parked, revision = store.schedules()["report"], store.schedules_revision()
    assert parked is not None
    resumed = schedules.resume("report")
    assert not resumed.paused and resumed == schedules.get("report")
    assert store.schedules()["report"] == parked, "the record still names the parked occurrence"
    assert store.schedules_revision() == revision, "nothing was written"
    assert store.get(occurrence_id(store.keys.namespace, "report", parked)).state == "due"


def test_a_rewind_leaves_the_record_at_an_occurrence_still_parked(store: DelayStore):
    RuntimeSchedules(store).add("report", "send_report", every=60)
    assert CronScheduler(store, builder=builder).run_pending() == 1
    parked = store.schedules()["report"]
    assert parked is not None and parked > store.now_ms()
    id = occurrence_id(store.keys.namespace, "report", parked)
    raw = store.stored_schedules().definitions["report"]

    def rewind(cancel: str | None) -> bool:
        update = store.update_schedule(
            "report", raw, revision=None, record=parked, record_action="rewind", cancel=cancel
        )
        assert update.done
        return update.cancelled

    # Not cancelled: a record rewound below it would let a scheduler park it again once it ran.
    assert not rewind(None) and store.schedules()["report"] == parked
    assert store.get(id).state == "due"
    # Cancelled: the schedule starts again from now.
    assert rewind(id) and store.schedules()["report"] < parked and store.get(id) is None


def test_an_occurrence_runs_once_after_a_resume_of_a_schedule_that_was_not_paused(store, client, ready_key):
    schedules = RuntimeSchedules(store)
    schedules.add("report", "send_report", every=2)
    assert CronScheduler(store, builder=builder).run_pending() == 1
    due = store.schedules()["report"]
    assert due is not None
    schedules.resume("report")
    id = occurrence_id(store.keys.namespace, "report", due)
    deliverer = DirectLists({"ready": ListTarget(ready_key, mode="rpush")})
    plain = Promoter(store, deliverer, max_idle=0.2).start()  # promotes, runs no schedule
    try:
        wait_for(lambda: any(run["id"] == id for run in runs(client, ready_key)), timeout=10)
        # A scheduler that reads the schedules now offers the next occurrence after the record.
        CronScheduler(store, builder=builder).run_pending()
        time.sleep(0.5)
    finally:
        plain.stop()
    assert [run["id"] for run in runs(client, ready_key)].count(id) == 1


def test_a_builder_refusing_one_stored_call_skips_that_schedule_only(store: DelayStore, caplog):
    def picky(call: ScheduledCall):
        if call.task == "unknown_actor":
            raise LookupError(f"no actor named {call.task!r}")
        return builder(call)

    schedules = RuntimeSchedules(store)
    schedules.add("good", "good_task", every=60)
    schedules.add("odd", "unknown_actor", every=60)
    with caplog.at_level(logging.ERROR, logger="delay_broker.cron"):
        assert CronScheduler(store, builder=picky).run_pending() == 1, "good's occurrence, parked"
    assert any("'odd'" in record.getMessage() for record in caplog.records)
