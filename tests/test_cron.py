"""Recurring schedules on a real redis-server: each occurrence parked once, whoever offers it and when."""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
import redis

from delay_broker import DelayStore, StoreError
from delay_broker.clock import due_to_ms
from delay_broker.cron import CronScheduler, Schedule, occurrence_id
from delay_broker.deliverers import DirectLists
from delay_broker.envelope import Envelope
from delay_broker.errors import ConfigurationError, DelayBrokerError
from delay_broker.promoter import Promoter
from delay_broker.targets import ListTarget

from .helpers import wait_for


def payload_of(id: str, due: datetime) -> Envelope:
    return Envelope(route="ready", payload=f"{id} {due.isoformat()}".encode())


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


# -- schedules -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cron", "zone", "problem"),
    [
        ("", "* * * * *", "UTC", "non-empty name"),
        ("   ", "* * * * *", "UTC", "non-empty name"),
        ("report", "every day at nine", "UTC", "not a valid cron expression"),
        ("report", "61 * * * *", "UTC", "not a valid cron expression"),
        ("report", None, "UTC", "either cron= or every="),
        ("report", "0 9 * * *", "Mars/Olympus_Mons", "unknown time zone"),
        ("report", "0 9 * * *", "America", "unknown time zone"),  # a directory of zones, no zone
        ("report", "0 9 * * *", "a" * 300, "unknown time zone"),  # too long for a file name
        ("report", "0 9 * * *", None, "IANA name or a tzinfo"),
        ("report", "0 0 31 2 *", "UTC", "has no next occurrence"),
    ],
)
def test_a_bad_schedule_is_refused_when_declared(name, cron, zone, problem):
    with pytest.raises(ConfigurationError, match=problem):
        Schedule.create(name, cron, payload_of, zone)


def test_next_occurrence_follows_the_schedules_time_zone():
    paris = Schedule.create("report", "0 9 * * *", payload_of, "Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert paris.next_after(at("2026-01-10T12:00:00+00:00")) == at("2026-01-11T08:00:00+00:00")
    assert paris.next_after(at("2026-07-10T06:00:00+00:00")) == at("2026-07-10T07:00:00+00:00")
    seconds = Schedule.create("tick", "* * * * * */15", payload_of)
    assert seconds.next_after(at("2026-01-01T00:00:00+00:00")) == at("2026-01-01T00:00:15+00:00")
    assert seconds.next_after(at("2026-01-01T00:00:14.999+00:00")) == at("2026-01-01T00:00:15+00:00")


def test_occurrence_ids_are_the_same_everywhere_and_differ_between_occurrences():
    first = occurrence_id("default", "report", 1_000)
    assert first == occurrence_id("default", "report", 1_000)
    others = {occurrence_id("default", "report", 2_000), occurrence_id("other", "report", 1_000)}
    assert first not in others and len(others) == 2
    assert occurrence_id("default", "digest", 1_000) != first


# -- the store's record of each schedule ----------------------------------------------------------------------


def test_an_occurrence_is_parked_once_even_when_offered_again_after_its_promotion(store: DelayStore):
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    id = occurrence_id(store.keys.namespace, "report", due_to_ms(due))
    first = store.park_occurrence("report", id, payload_of(id, due), due)
    assert first.outcome == "new" and store.get(id).state == "due"
    assert store.park_occurrence("report", id, payload_of(id, due), due).outcome == "kept"

    # Promoted and acknowledged: the store no longer holds it, and a late scheduler must not park it again.
    store.reschedule(id, delay=0)
    claim = store.claim(10, 30, "promoter")
    assert [message.id for message in claim.messages] == [id]
    store.ack(claim.lease_deadline_ms, [id])
    late = store.park_occurrence("report", id, payload_of(id, due), due)
    assert (late.outcome, late.due_ms) == ("kept", due_to_ms(due)), "refused, with the latest occurrence's time"
    assert store.get(id) is None
    earlier = due - timedelta(minutes=5)
    assert store.park_occurrence("report", "earlier", payload_of("earlier", earlier), earlier).outcome == "kept"

    later = due + timedelta(hours=1)
    assert store.park_occurrence("report", "next", payload_of("next", later), later).outcome == "new"
    assert store.schedules() == {"report": due_to_ms(later)}
    # Schedules are independent of one another.
    assert store.park_occurrence("digest", "d1", payload_of("d1", due), due).outcome == "new"


def test_a_malformed_schedule_record_is_reported_and_nothing_is_parked(store: DelayStore, client: redis.Redis):
    client.hset(store.keys.cron, "report", "not a time")
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(DelayBrokerError, match="malformed record of schedule report"):
        store.park_occurrence("report", "r1", payload_of("r1", due), due)
    assert store.get("r1") is None
    assert store.schedules() == {"report": None}
    assert store.forget_schedule("report") and store.schedules() == {}
    assert store.park_occurrence("report", "r1", payload_of("r1", due), due).outcome == "new"


@pytest.mark.parametrize(
    "record", ["1e400", "-1e400", "1e15", "0x10", "1.5", "nan", "inf", "-5", " 12 ", "+12", "1_000", "\u0663", ""]
)
def test_a_record_that_is_not_plain_digits_is_malformed_in_the_script_as_in_python(store, client, record: str):
    client.hset(store.keys.cron, "report", record)
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(DelayBrokerError, match="malformed record of schedule report"):
        store.park_occurrence("report", "r1", payload_of("r1", due), due)
    assert store.get("r1") is None and client.hget(store.keys.cron, "report") == record.encode()
    assert store.schedules() == {"report": None}, "Python reads it as malformed too"


@pytest.mark.parametrize("name", ["nightly-LOADING", "billing:OOM", "READONLY"])
def test_a_schedule_named_like_a_redis_refusal_is_not_taken_for_one(store: DelayStore, client: redis.Redis, name: str):
    client.hset(store.keys.cron, name, "garbage")
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    with pytest.raises(DelayBrokerError, match="malformed record") as raised:
        store.park_occurrence(name, "r1", payload_of("r1", due), due)
    assert not isinstance(raised.value, StoreError), "a bad record, not an outage to back off from"


def test_a_cron_key_of_the_wrong_type_stops_scheduled_parks_only(store: DelayStore, client: redis.Redis):
    client.set(store.keys.cron, "spoiled")
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    try:
        with pytest.raises(DelayBrokerError, match="WRONGTYPE"):
            store.park_occurrence("report", "r1", payload_of("r1", due), due)
        assert store.get("r1") is None
        # Ordinary sends never read the schedule records: a stray key there must not stop them.
        assert store.park("plain", payload_of("plain", due), delay=60).outcome == "new"
    finally:
        client.delete(store.keys.cron)


# -- schedulers in promoters -----------------------------------------------------------------------------------


def every_second(name: str = "tick") -> Schedule:
    # Every other second: a promoter stalled for a whole period by a loaded machine would skip one.
    return Schedule.create(name, "* * * * * */2", payload_of)


def test_three_promoters_sharing_a_schedule_run_each_occurrence_once(store: DelayStore, client, ready_key):
    deliverer = DirectLists({"ready": ListTarget(ready_key, mode="rpush")})
    promoters = [
        Promoter(store, deliverer, cron=CronScheduler(store, [every_second()]), max_idle=1, keep_lateness=True)
        for _ in range(3)
    ]
    started_ms = store.now_ms()
    for promoter in promoters:
        promoter.start()
    try:
        # The next occurrence is parked in the cycle after the last one was promoted: wait for that too.
        wait_for(lambda: client.llen(ready_key) >= 3 and store.stats().parked == 1, timeout=20)
    finally:
        for promoter in promoters:
            promoter.stop()
    runs = [item.decode().split(" ") for item in client.lrange(ready_key, 0, -1)]
    dues = [at(due) for _, due in runs]
    assert Counter(id for id, _ in runs).most_common(1)[0][1] == 1, "no occurrence ran twice"
    assert dues == sorted(dues) and all(b - a == 2000 for a, b in itertools.pairwise(dues))
    assert all(id == occurrence_id(store.keys.namespace, "tick", due) for (id, _), due in zip(runs, dues, strict=True))
    assert dues[0] > started_ms, "occurrences before the first promoter started are not made up"
    assert sum(promoter.counters.promoted for promoter in promoters) == len(runs)
    # The next occurrence is already parked, one period ahead.
    assert store.schedules()["tick"] == dues[-1] + 2000


def test_a_failing_schedule_does_not_stop_the_others_or_the_promoter(store, client, ready_key, caplog):
    def broken(id: str, due: datetime) -> Envelope:
        raise RuntimeError("cannot build this message")

    client.hset(store.keys.cron, "spoiled", "garbage")
    scheduler = CronScheduler(
        store,
        [
            Schedule.create("broken", "* * * * * *", broken),
            Schedule.create("spoiled", "* * * * * *", payload_of),
            every_second("healthy"),
        ],
    )
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), cron=scheduler, max_idle=1)
    with caplog.at_level(logging.ERROR, logger="delay_broker.cron"):
        promoter.start()
        try:
            wait_for(lambda: client.llen(ready_key) >= 2, timeout=20)
        finally:
            promoter.stop()
    assert promoter.counters.errors == 0
    messages = [record.getMessage() for record in caplog.records]
    assert sum("'broken'" in message for message in messages) == 1, "logged once, not at every occurrence"
    assert sum("malformed record of schedule spoiled" in message for message in messages) == 1
    assert set(store.schedules()) == {"healthy", "spoiled"}


def test_a_scheduler_looks_again_only_when_an_occurrence_has_passed(store: DelayStore):
    scheduler = CronScheduler(store, [Schedule.create("hourly", "0 * * * *", payload_of)])
    assert scheduler.run_pending() == 1
    assert scheduler.run_pending() == 0, "nothing to do before the occurrence"
    assert 0 < scheduler.seconds_until_due() <= 60.01, "looks again within a minute at most"
    again = CronScheduler(store, [Schedule.create("hourly", "0 * * * *", payload_of)])
    assert again.run_pending() == 0, "another process offering the same occurrence parks nothing"
    assert store.stats().parked == 1
    with pytest.raises(ConfigurationError, match="already a schedule named"):
        again.add(Schedule.create("hourly", "30 * * * *", payload_of))


def test_a_scheduler_that_fell_behind_parks_the_missed_occurrence_late(store: DelayStore):
    scheduler = CronScheduler(store, [Schedule.create("tick", "* * * * * *", payload_of)])
    assert scheduler.run_pending() == 1
    first = store.schedules()["tick"]
    # Stalled past the next occurrence (a long delivery, a broker outage): nobody parked it in time.
    wait_for(lambda: store.now_ms() > first + 1500, timeout=5)
    assert scheduler.run_pending() == 1
    missed = store.get(occurrence_id(store.keys.namespace, "tick", first + 1000))
    assert missed is not None and missed.state == "due" and missed.due_ms == first + 1000, "parked late, not lost"
    assert scheduler.seconds_until_due() < 0.01, "and the one after it is looked at at once"
    time.sleep(0.01)
    assert scheduler.run_pending() == 1
    assert store.schedules()["tick"] == first + 2000

    # A promoter starting now catches up from the store's record too (a restart shorter than CATCH_UP_MS).
    wait_for(lambda: store.now_ms() > first + 3500, timeout=5)
    fresh = CronScheduler(store, [Schedule.create("tick", "* * * * * *", payload_of)])
    assert fresh.run_pending() == 1
    assert store.get(occurrence_id(store.keys.namespace, "tick", first + 3000)) is not None


def test_a_record_ahead_of_the_expression_is_reported_once(store: DelayStore, client, caplog):
    # As after changing a monthly schedule to an hourly one: the record holds next month's occurrence.
    far = store.now_ms() + 30 * 86_400_000
    client.hset(store.keys.cron, "report", far)
    scheduler = CronScheduler(store, [Schedule.create("report", "0 * * * *", payload_of)])
    with caplog.at_level(logging.WARNING, logger="delay_broker.cron"):
        assert scheduler.run_pending() == 0
        scheduler._next_check = 0.0  # look again at once
        assert scheduler.run_pending() == 0
    warnings = [record.getMessage() for record in caplog.records if "already parked" in record.getMessage()]
    assert len(warnings) == 1 and "cron forget report" in warnings[0]


def test_a_corrupt_counter_refuses_an_occurrence_without_moving_the_record(store: DelayStore, client):
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    client.hset(store.keys.stats, "parked", "not a number")
    try:
        with pytest.raises(DelayBrokerError, match="not an integer counter"):
            store.park_occurrence("report", "r1", payload_of("r1", due), due)
        assert store.schedules() == {}, "the record did not move: the occurrence can still be parked"
    finally:
        client.hdel(store.keys.stats, "parked")
    assert store.park_occurrence("report", "r1", payload_of("r1", due), due).outcome == "new"


def test_a_spoiled_cron_key_does_not_stop_the_promotion_of_other_messages(store, client, ready_key, caplog):
    client.set(store.keys.cron, "spoiled")
    promoter = Promoter(
        store, DirectLists({"ready": ListTarget(ready_key)}), cron=CronScheduler(store, [every_second()]), max_idle=1
    )
    try:
        with caplog.at_level(logging.ERROR, logger="delay_broker.cron"):
            promoter.start()
            store.park("plain", Envelope(route="ready", payload=b"plain"), delay=0)
            wait_for(lambda: client.lrange(ready_key, 0, -1) == [b"plain"], timeout=10)
    finally:
        promoter.stop()
        client.delete(store.keys.cron)
    assert promoter.counters.errors == 0
    assert any("WRONGTYPE" in record.getMessage() for record in caplog.records), "the schedule reports it"


class FailingScheduler(CronScheduler):
    """A scheduler whose every look fails as nothing foreseen would (a bug, a reply nobody expected)."""

    looks = 0

    def run_pending(self) -> int:
        self.looks += 1
        raise RecursionError("maximum recursion depth exceeded")


def test_a_failing_scheduler_does_not_stop_the_promotion_and_backs_off(store, client, ready_key, caplog):
    scheduler = FailingScheduler(store)
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready_key)}), cron=scheduler, max_idle=1)
    try:
        with caplog.at_level(logging.ERROR, logger="delay_broker.promoter"):
            promoter.start()
            store.park("plain", Envelope(route="ready", payload=b"plain"), delay=0)
            wait_for(lambda: client.lrange(ready_key, 0, -1) == [b"plain"], timeout=5)
            store.park("later", Envelope(route="ready", payload=b"later"), delay=0.5)
            wait_for(lambda: client.llen(ready_key) == 2, timeout=5)
            time.sleep(1.0)
    finally:
        promoter.stop()
    assert 2 <= scheduler.looks <= 25, f"retried with a backoff, not at every turn ({scheduler.looks} looks)"
    assert promoter.counters.errors == scheduler.looks
    failures = [record for record in caplog.records if "recurring schedules failed" in record.getMessage()]
    assert len(failures) == 1, "logged once per run of failures"
