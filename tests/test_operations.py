"""The operations layer on a real redis-server: filters find exactly the matching messages, page by page, on one
shard or many; bulk actions act on exactly those and report what they did."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
import redis

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.operations import MessageFilter, Operations

from .helpers import celery_envelope, dramatiq_envelope

HOUR_MS = 3_600_000


def celery_with_args(task: str, id: str, queue: str, args: list) -> Envelope:
    envelope = celery_envelope(task, id, queue)
    message = json.loads(envelope.payload)
    message["body"] = base64.b64encode(json.dumps([args, {}, {}]).encode()).decode()
    return Envelope(route=queue, payload=json.dumps(message).encode(), framework="celery", name=task)


@pytest.fixture(params=[1, 4], ids=["one-shard", "four-shards"])
def sharded(client: redis.Redis, namespace: str, request) -> DelayStore:
    return DelayStore(client, namespace=namespace, shards=request.param)


def populate(store: DelayStore) -> dict[str, dict]:
    """420 messages: Dramatiq emails, Celery reports (some for customer 'acme'), and others, due over 7 hours."""
    now = store.now_ms()
    expected: dict[str, dict] = {}
    requests = []
    for n in range(420):
        kind = n % 3
        if kind == 0:
            id, envelope = f"mail-{n:04d}", dramatiq_envelope("send_email", f"mail-{n:04d}", queue="emails")
            meta = {"queue": "emails", "task": "send_email", "text": ""}
        elif kind == 1:
            customer = "acme" if n % 7 == 1 else "globex"
            id = f"rep-{n:04d}"
            envelope = celery_with_args("tasks.report", id, "reports", [customer, n])
            meta = {"queue": "reports", "task": "tasks.report", "text": customer}
        else:
            id, envelope = f"misc-{n:04d}", dramatiq_envelope("cleanup", f"misc-{n:04d}", queue="default")
            meta = {"queue": "default", "task": "cleanup", "text": ""}
        due_ms = now + HOUR_MS + (n % 7) * HOUR_MS
        meta["due_ms"] = due_ms
        expected[id] = meta
        requests.append(ParkRequest(id, envelope, due=datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc)))
    store.park_many(requests)
    return expected


def all_pages(ops: Operations, filter: MessageFilter, limit: int) -> list[str]:
    ids, cursor, pages = [], None, 0
    while True:
        page = ops.find(filter, cursor=cursor, limit=limit)
        assert len(page.messages) <= limit
        ids.extend(info.id for info in page.messages)
        pages += 1
        cursor = page.cursor
        if cursor is None:
            return ids
        assert pages < 1000


@pytest.mark.parametrize(
    ("filter", "wanted"),
    [
        (MessageFilter(queue="emails"), lambda m: m["queue"] == "emails"),
        (MessageFilter(task="tasks.report"), lambda m: m["task"] == "tasks.report"),
        (MessageFilter(queue="reports", text="ACME"), lambda m: m["text"] == "acme"),
        (MessageFilter(id_prefix="misc-01"), None),
        (MessageFilter(task="nothing-like-this"), lambda m: False),
        (MessageFilter(), lambda m: True),
    ],
)
def test_a_filter_finds_exactly_the_matching_messages_page_by_page_in_due_order(sharded, filter, wanted):
    expected = populate(sharded)
    ops = Operations(sharded)
    if wanted is None:
        matching = {id for id in expected if id.startswith(filter.id_prefix)}
    else:
        matching = {id for id, meta in expected.items() if wanted(meta)}
    found = all_pages(ops, filter, limit=17)
    assert len(found) == len(set(found)), "no message on two pages"
    assert set(found) == matching
    dues = [expected[id]["due_ms"] for id in found]
    assert dues == sorted(dues), "oldest first, across shards"
    count = ops.count(filter)
    assert count.complete and count.matched == len(matching)


def test_a_due_window_bounds_the_scan(sharded):
    expected = populate(sharded)
    first = min(meta["due_ms"] for meta in expected.values())
    window = MessageFilter(start_ms=first + HOUR_MS, end_ms=first + 2 * HOUR_MS, queue="emails")
    found = set(all_pages(Operations(sharded), window, limit=50))
    assert found == {
        id
        for id, meta in expected.items()
        if meta["queue"] == "emails" and first + HOUR_MS <= meta["due_ms"] <= first + 2 * HOUR_MS
    }
    with pytest.raises(ValueError, match="ends before it starts"):
        MessageFilter(start_ms=10, end_ms=5)


def test_a_bad_cursor_is_refused(sharded):
    with pytest.raises(ValueError, match="not a cursor"):
        Operations(sharded).find(MessageFilter(), cursor="x.y")


def test_bulk_cancel_by_filter_removes_exactly_those_and_reports_it(sharded):
    expected = populate(sharded)
    ops = Operations(sharded)
    result = ops.cancel(filter=MessageFilter(queue="reports", text="acme"))
    acme = {id for id, meta in expected.items() if meta["text"] == "acme"}
    assert (result.action, result.matched, result.done, result.skipped) == ("cancel", len(acme), len(acme), [])
    assert all(sharded.get(id) is None for id in acme)
    assert sharded.stats().parked == len(expected) - len(acme)
    again = ops.cancel(ids=[*sorted(acme)[:3], "mail-0000"])
    assert again.done == 1 and again.skipped == sorted(acme)[:3]


def test_run_now_and_reschedule_by_filter_move_only_the_matching(sharded):
    expected = populate(sharded)
    ops = Operations(sharded)
    moved = ops.run_now(filter=MessageFilter(task="cleanup", id_prefix="misc-00"))
    chosen = {id for id in expected if id.startswith("misc-00")}
    assert moved.done == len(chosen) == moved.matched
    now = sharded.now_ms()
    for id in chosen:
        info = sharded.get(id)
        assert info is not None and info.due_ms is not None and info.due_ms <= now
    later = datetime.now(timezone.utc) + timedelta(days=30)
    reports = ops.reschedule(filter=MessageFilter(queue="reports", text="acme"), due=later)
    assert reports.done == reports.matched > 0
    some = next(id for id, meta in expected.items() if meta["text"] == "acme")
    info = sharded.get(some)
    assert info is not None and info.due_ms is not None and abs(info.due_ms - later.timestamp() * 1000) < 2
    headers = json.loads(info.envelope.payload)["headers"]  # type: ignore[union-attr]
    assert headers["eta"].startswith(later.date().isoformat()), "a Celery task's eta moves with it"


UNREADABLE_CELERY = {
    "bad-bytes": b"\x80not json",
    "bad-json": b"{not json",
    "bad-shape": b"[1, 2]",
    "bad-deep": b"[" * 100_000 + b"]" * 100_000,
}
"""Celery payloads whose eta cannot be rewritten: not UTF-8, not JSON, not kombu's record, nested too deep."""


@pytest.mark.parametrize("how", ["filter", "ids"])
def test_a_bulk_move_goes_on_past_celery_messages_it_cannot_rewrite_and_names_them(sharded, how):
    """Run now and reschedule move every other message, and report each unreadable one with the reason; those
    are left as they were."""
    for n in range(6):
        sharded.park(f"cel-{n}", celery_envelope("tasks.add", f"cel-{n}"), delay=3600)
    for id, payload in UNREADABLE_CELERY.items():
        sharded.park(id, Envelope("celery", payload, framework="celery", name="tasks.add"), delay=3600)
    stored = {id: sharded.get(id) for id in UNREADABLE_CELERY}
    ops = Operations(sharded)
    ids = [*UNREADABLE_CELERY, *(f"cel-{n}" for n in range(6))]
    targets = {"filter": MessageFilter(task="tasks.add")} if how == "filter" else {"ids": sorted(ids)}
    later = datetime.now(timezone.utc) + timedelta(days=3)
    for result in (ops.reschedule(**targets, due=later), ops.run_now(**targets)):
        assert (result.matched, result.done, result.skipped) == (10, 6, [])
        assert sorted(result.failed) == sorted(UNREADABLE_CELERY)
        assert "UnicodeDecodeError" in result.failed["bad-bytes"] and "JSONDecodeError" in result.failed["bad-json"]
    now = sharded.now_ms()
    assert all(sharded.get(f"cel-{n}").due_ms <= now for n in range(6))  # type: ignore[union-attr,operator]
    assert {id: sharded.get(id) for id in UNREADABLE_CELERY} == stored, "left as they were"


def test_dead_letters_are_requeued_and_purged_by_filter(sharded):
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    for n in range(30):
        queue = "payments" if n % 2 else "emails"
        sharded.park(f"d-{n}", dramatiq_envelope("charge", f"d-{n}", queue=queue), due=past)
    for shard in range(len(sharded.shards)):
        claim = sharded.claim(100, 60, "ops-test", shard=shard)
        sharded.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages], shard=shard)
    ops = Operations(sharded)
    assert ops.count(MessageFilter(state="dead")).matched == 30
    requeued = ops.requeue(filter=MessageFilter(state="dead", queue="payments"))
    assert requeued.done == requeued.matched == 15
    purged = ops.purge(filter=MessageFilter(state="dead"))
    assert purged.done == purged.matched == 15
    assert sharded.stats().dead == 0 and sharded.stats().parked == 15


def test_ids_or_a_filter_not_both(sharded):
    with pytest.raises(ValueError, match="ids or a filter"):
        Operations(sharded).cancel(ids=["a"], filter=MessageFilter())
    with pytest.raises(ValueError, match="applies to dead messages, not due"):
        Operations(sharded).requeue(filter=MessageFilter(state="due"))


def test_paging_goes_on_from_where_it_stopped_while_the_store_changes(sharded):
    """A cursor is a position, not an offset: messages cancelled, promoted or parked before it meanwhile neither
    hide later messages from the next page nor show earlier ones again."""
    expected = populate(sharded)
    ops = Operations(sharded)
    emails = sorted((meta["due_ms"], id) for id, meta in expected.items() if meta["queue"] == "emails")
    first = ops.find(MessageFilter(queue="emails"), limit=17)
    shown = [info.id for info in first.messages]
    # Everything before the cursor leaves (the page just shown and every other message due as early) ...
    last_due = max(expected[id]["due_ms"] for id in shown)
    sharded.cancel_many([id for id, meta in expected.items() if meta["due_ms"] < last_due or id in shown])
    # ... and messages are parked both before the cursor (not to be shown) and after it.
    before = datetime.fromtimestamp((last_due - 1) / 1000, tz=timezone.utc)
    after = datetime.fromtimestamp((last_due + 10 * HOUR_MS) / 1000, tz=timezone.utc)
    sharded.park("mail-early", dramatiq_envelope("send_email", "mail-early", queue="emails"), due=before)
    sharded.park("mail-late", dramatiq_envelope("send_email", "mail-late", queue="emails"), due=after)
    rest, cursor = [], first.cursor
    while cursor is not None:
        page = ops.find(MessageFilter(queue="emails"), cursor=cursor, limit=17)
        rest.extend(info.id for info in page.messages)
        cursor = page.cursor
    wanted = [id for due, id in emails if due >= last_due and id not in shown]
    assert sorted(rest) == sorted([*wanted, "mail-late"]), "every later message once, none before the cursor"


def test_a_bulk_action_misses_nothing_when_messages_ahead_of_its_scan_leave(client, namespace):
    """The scan behind a bulk action goes on from a position: entries before it removed between two of its
    calls (a promoter at work) do not make it jump over matching messages."""
    store = DelayStore(client, namespace=namespace)
    now = store.now_ms()
    requests = []
    for n in range(6000):
        queue = "emails" if n % 2 else "ready"
        due = datetime.fromtimestamp((now + HOUR_MS + n) / 1000, tz=timezone.utc)
        requests.append(ParkRequest(f"{queue}-{n}", dramatiq_envelope("job", f"{queue}-{n}", queue=queue), due=due))
    store.park_many(requests)
    ops = Operations(store)
    seen = []
    for info in ops.matches(MessageFilter(queue="emails")):
        if not seen:  # the first scan call is over: everything it went past leaves
            store.cancel_many([f"ready-{n}" for n in range(0, 6000, 2)])
        seen.append(info.id)
    assert len(seen) == len(set(seen)) == 3000


def test_a_scan_goes_on_past_messages_sharing_a_score_after_its_last_one_left(sharded):
    """Dead letters of one batch share their score: a page that ended inside them goes on with the next one by
    id, also when the last one shown is gone (requeued) by the next page."""
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    ids = [f"tie-{n:03d}" for n in range(120)]
    sharded.park_many([ParkRequest(id, dramatiq_envelope("charge", id, queue="q"), due=past) for id in ids])
    for shard in range(len(sharded.shards)):
        claim = sharded.claim(1000, 60, "ops-test", shard=shard)
        sharded.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages], shard=shard)
    ops = Operations(sharded)
    found, cursor = [], None
    while True:
        page = ops.find(MessageFilter(state="dead", queue="q"), cursor=cursor, limit=7)
        found.extend(info.id for info in page.messages)
        if page.messages and len(found) % 2:
            sharded.requeue_dead([page.messages[-1].id])  # the position's own entry leaves
        cursor = page.cursor
        if cursor is None:
            break
    assert sorted(found) == ids


@pytest.mark.parametrize(
    "text", ["Café Zürich", "ZÜRICH", 'said "hi"', "C:\\temp\\report.csv", "line1\nline2", "tab\there"], ids=repr
)
def test_the_text_filter_finds_what_json_escapes_in_a_dramatiq_message(client, namespace, text):
    """Dramatiq's encoder escapes non-ASCII text, quotes, backslashes and control characters: the filter looks
    in the arguments as they read, not only in the stored bytes."""
    import dramatiq

    store = DelayStore(client, namespace=namespace)
    for id, argument in (("wanted", f"<{text}>"), ("other", "nothing to see")):
        message = dramatiq.Message(queue_name="q", actor_name="notify", args=(argument,), kwargs={}, options={})
        store.park(id, Envelope("q", message.encode(), framework="dramatiq", name="notify"), delay=600)
    assert "\\" in store.get("wanted").envelope.payload.decode() or text.isascii()  # type: ignore[union-attr]
    found = [info.id for info in Operations(store).matches(MessageFilter(text=text))]
    assert found == ["wanted"]


def test_a_message_whose_adapter_cannot_load_is_not_moved_without_it(store: DelayStore, monkeypatch) -> None:
    """A framework whose adapter declares a rescheduler (an entry point) that cannot be imported here (its
    framework not installed): moved by the store alone, the message would keep its old due time inside. Refused,
    saying why, and left as it was."""
    from importlib.metadata import EntryPoint

    from delay_broker import ConfigurationError, rescheduling
    from delay_broker.operations import reschedule_one

    declared = EntryPoint("elsewhere", "no_such_framework_adapter:reschedule", rescheduling.ENTRY_POINT_GROUP)
    monkeypatch.setattr(rescheduling, "_declared", {"elsewhere": declared})
    store.park("job", Envelope(route="q", payload=b"{}", framework="elsewhere"), delay=3600)
    due_ms = store.get("job").due_ms
    with pytest.raises(ConfigurationError, match=r"moving a elsewhere message .* needs elsewhere installed"):
        reschedule_one(store, "job", datetime.now(timezone.utc) + timedelta(minutes=1))
    assert store.get("job").due_ms == due_ms
    assert rescheduling.rescheduler_for("dramatiq") is None, "a framework without one: the store moves it"
