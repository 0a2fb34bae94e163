"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real redis-server holding
messages parked by real Dramatiq and Celery producers: the numbers, filters, a bulk cancel, read-only mode,
CSRF, and stored data shown as text."""

from __future__ import annotations

import contextlib
import html
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import dramatiq
import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker
from playwright.sync_api import Browser, Page, sync_playwright

from delay_broker import DelayStore, Envelope
from delay_broker.celery import install
from delay_broker.dramatiq import DelayMiddleware
from delay_broker.embedded import EmbeddedRedis, free_port
from delay_broker.operations import MessageFilter, Operations
from delay_broker.web import create_app

from .browser import launch
from .servers import PostgresServer


@dataclass
class Served:
    url: str
    store: DelayStore


def serve(app: Any) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


@contextlib.contextmanager
def own_dashboard(redis_server: EmbeddedRedis) -> Iterator[Served]:
    """A dashboard on a namespace of its own, for a test that changes what the module's store holds."""
    store = DelayStore(redis_server.client(), namespace=f"webown-{uuid.uuid4().hex[:8]}")
    url, server, thread = serve(create_app(store))
    try:
        yield Served(url, store)
    finally:
        server.should_exit = True
        thread.join(10)
        keys = store.keys.all()
        if keys:
            store.client.delete(*keys)


@pytest.fixture(scope="module")
def namespace() -> str:
    return f"web-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def populated(redis_server: EmbeddedRedis, namespace: str) -> Iterator[DelayStore]:
    """12 Dramatiq messages (8 send_welcome to 'emails', 4 build_report to 'reports'), one of them carrying a
    <script> argument, and 6 Celery tasks (tasks.bill), all parked by the frameworks themselves."""
    broker = StubBroker()
    broker.add_middleware(DelayMiddleware(client=redis_server.client(), namespace=namespace, threshold=1))
    welcome = dramatiq.actor(lambda user: None, broker=broker, actor_name="send_welcome", queue_name="emails")
    report = dramatiq.actor(lambda day: None, broker=broker, actor_name="build_report", queue_name="reports")
    for n in range(8):
        welcome.send_with_options(args=(f"user-{n}",), delay=3_600_000 + n)
    for n in range(4):
        report.send_with_options(args=(f"day-{n}",), delay=7_200_000 + n)
    welcome.send_with_options(args=("<script>alert('owned')</script>",), delay=3_600_000)
    app = Celery(f"web{namespace}", broker=redis_server.url, set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": f"{namespace}:"}
    install(app, threshold=1.0, namespace=namespace)
    for n in range(6):
        app.send_task("tasks.bill", args=[f"customer-{n}", n], countdown=5400 + n)
    app.close()
    broker.close()
    yield DelayStore(redis_server.client(), namespace=namespace)


@pytest.fixture(scope="module")
def dashboards(populated: DelayStore) -> Iterator[tuple[Served, Served]]:
    url, server, thread = serve(create_app(populated))
    ro_url, ro_server, ro_thread = serve(create_app(populated, read_only=True))
    try:
        yield Served(url, populated), Served(ro_url, populated)
    finally:
        server.should_exit = ro_server.should_exit = True
        thread.join(10)
        ro_thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.dialogs = dialogs  # type: ignore[attr-defined]
    yield page
    context.close()


def session_of(base: str) -> tuple[str, str]:
    """A session the dashboard at ``base`` issued: its cookie (``name=value``) and the form token of its pages."""
    with urllib.request.urlopen(base + "/messages?state=due", timeout=10) as response:
        cookie = response.headers["Set-Cookie"].split(";", 1)[0]
        (token,) = re.findall(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    return cookie, token


def post_form(url: str, fields: dict[str, str]) -> Any:
    """POST ``fields`` as the dashboard's own form would: with the session cookie and form token a page of the
    dashboard gave (the server signs both, so a made-up pair no longer passes)."""
    cookie, token = session_of(url.rsplit("/actions", 1)[0])
    form = urllib.parse.urlencode({**fields, "csrf_token": token}).encode()
    request = urllib.request.Request(url, data=form, headers={"Cookie": cookie})
    return urllib.request.urlopen(request, timeout=10)


def number(page: Page, selector: str) -> int:
    return int(page.locator(selector).inner_text().replace(",", ""))


def listed_ids(page: Page) -> list[str]:
    return [row.get_attribute("data-id") or "" for row in page.locator("tr.message-row").all()]


def test_the_overview_shows_what_the_store_holds(dashboards, page: Page) -> None:
    served, _ = dashboards
    page.goto(served.url + "/")
    stats = served.store.stats()
    assert number(page, "#parked") == stats.parked == 19
    assert number(page, "#inflight") == stats.inflight
    assert number(page, "#dead") == stats.dead
    assert number(page, "#overdue") == stats.overdue
    assert number(page, "#live-promoters") == stats.live_promoters
    assert page.locator("svg.chart").count() == 2, "due-time and lateness charts, inline"


def test_a_filter_finds_exactly_the_matching_messages(dashboards, page: Page) -> None:
    served, _ = dashboards
    page.goto(served.url + "/messages?state=due")
    page.fill("input[name=task]", "send_welcome")
    page.click("#apply-filter")
    found = listed_ids(page)
    expected = [
        info.id for info in served.store.iter_all("due") if info.envelope and info.envelope.name == "send_welcome"
    ]
    assert sorted(found) == sorted(expected) and len(found) == 9
    page.goto(served.url + "/messages?state=due&text=customer-3")
    (only,) = listed_ids(page)
    assert served.store.get(only).envelope.framework == "celery"  # type: ignore[union-attr]


def test_a_payload_with_a_script_is_shown_as_text(dashboards, page: Page) -> None:
    served, _ = dashboards
    target = next(info.id for info in served.store.iter_all("due") if info.raw and b"owned" in info.raw)
    page.goto(served.url + "/message?id=" + urllib.parse.quote(target))
    assert "<script>alert('owned')</script>" in page.locator("#payload").inner_text()
    assert page.locator("#payload script").count() == 0
    page.wait_for_timeout(300)
    assert page.dialogs == [], "nothing stored ran"  # type: ignore[attr-defined]


def test_a_bulk_cancel_shows_its_count_and_removes_exactly_those(dashboards, page: Page) -> None:
    served, _ = dashboards
    before = {info.id: info.envelope.name for info in served.store.iter_all("due") if info.envelope}
    reports = {id for id, name in before.items() if name == "build_report"}
    page.goto(served.url + "/messages?state=due&task=build_report")
    page.click("#bulk-cancel")
    assert "4" in page.locator("#confirm-count").inner_text()
    page.click("#confirm")
    assert "4 of 4" in page.locator("#result").inner_text()
    after = {info.id for info in served.store.iter_all("due")}
    assert after == set(before) - reports, "exactly the matching messages are gone"


@pytest.mark.parametrize("target", [" ", "victim-a\nvictim-b-not", "victim-a\r\n"], ids=repr)
def test_a_single_message_action_touches_that_message_alone(
    redis_server: EmbeddedRedis, page: Page, target: str
) -> None:
    """Ids may be blank or hold line breaks: the message page's button acts on its own message, never on the
    whole store (an empty id list once meant "no filter") nor on a message whose id is a line of this one."""
    store = DelayStore(redis_server.client(), namespace=f"websingle-{uuid.uuid4().hex[:8]}")
    others = ["victim-a", "victim-b-not", "bystander"]
    for id in {target, *others}:
        store.park(id, Envelope("emails", b"{}"), delay=3600)
    url, server, thread = serve(create_app(store))
    try:
        page.goto(url + "/message?" + urllib.parse.urlencode({"id": target}))
        assert page.locator("#single-cancel").count() == 1, "the message's own page"
        page.click("#single-cancel")
        assert "1" in page.locator("#confirm-count").inner_text()
        page.click("#confirm")
        assert "1 of 1" in page.locator("#result").inner_text()
        assert {info.id for info in store.iter_all("due")} == set(others) - {target}
    finally:
        server.should_exit = True
        thread.join(10)
        store.client.delete(*store.keys.all())


def test_an_action_naming_no_message_and_no_filter_is_refused(dashboards) -> None:
    """A form without ids and without scope=filter touches nothing (it once meant every parked message)."""
    served, _ = dashboards
    parked = served.store.stats().parked
    for fields in ({"ids": ""}, {"ids": "[]"}, {"ids": "[1]"}, {}):
        form = {"action": "cancel", "confirmed": "yes", **fields}
        with pytest.raises(urllib.error.HTTPError) as refused:
            post_form(served.url + "/actions", form)
        assert refused.value.code == 400, fields
    assert served.store.stats().parked == parked


@pytest.mark.parametrize(
    "path", ["/message?id=" + "x" * 513, "/messages?state=due&to=99999999w", "/messages?from=-99999999w&queue=q"]
)
def test_malformed_input_gets_a_page_that_says_what_is_wrong(dashboards, path: str) -> None:
    served, _ = dashboards
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(served.url + path, timeout=10)
    assert refused.value.code == 400
    assert b"Internal Server Error" not in refused.value.read()


def test_an_id_the_store_refuses_fails_the_action_before_any_id_is_acted_on(redis_server: EmbeddedRedis) -> None:
    """An id that is not UTF-8 (a lone surrogate in the JSON list) or that the store refuses gets a 400 that
    says so, and the ids listed before it are left as they were, for every action."""
    with own_dashboard(redis_server) as served:
        served.store.park("first", Envelope("emails", b"{}"), delay=3600)
        for action in ("cancel", "run_now", "requeue", "purge"):
            for bad in ("\ud800", "", "x" * 513):
                form = {"action": action, "ids": json.dumps(["first", bad]), "confirmed": "yes"}
                with pytest.raises(urllib.error.HTTPError) as refused:
                    post_form(served.url + "/actions", form)
                assert refused.value.code == 400, (action, bad)
                assert "Nothing was done: message id" in html.unescape(refused.value.read().decode())
        info = served.store.get("first")
        assert info is not None and info.state == "due" and info.due_ms is not None
        assert info.due_ms > served.store.now_ms() + 3_000_000, "not run now"


def test_a_store_that_cannot_be_reached_gets_a_page_that_says_so(redis_server: EmbeddedRedis) -> None:
    with EmbeddedRedis() as gone:
        store = DelayStore(gone.client(), namespace="web-down")
    url, server, thread = serve(create_app(store))
    try:
        for path in ("/", "/messages?state=due", "/message?id=a", "/schedules"):
            with pytest.raises(urllib.error.HTTPError) as failed:
                urllib.request.urlopen(url + path, timeout=30)
            assert failed.value.code == 503, path
            assert b"The store cannot be read now" in failed.value.read()
    finally:
        server.should_exit = True
        thread.join(10)


def test_read_only_mode_offers_and_accepts_no_write(dashboards, page: Page) -> None:
    _, read_only = dashboards
    page.goto(read_only.url + "/messages?state=due")
    assert page.locator("#read-only").is_visible()
    assert page.locator("#bulk-cancel").count() == 0
    parked = read_only.store.stats().parked
    form = urllib.parse.urlencode({"action": "cancel", "state": "due", "confirmed": "yes"}).encode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(read_only.url + "/actions", data=form), timeout=10)
    assert refused.value.code == 403 and read_only.store.stats().parked == parked


def test_a_write_without_the_csrf_token_is_refused(dashboards) -> None:
    served, _ = dashboards
    parked = served.store.stats().parked
    form = urllib.parse.urlencode({"action": "cancel", "state": "due", "confirmed": "yes", "csrf_token": "x"}).encode()
    request = urllib.request.Request(served.url + "/actions", data=form, headers={"Cookie": "delay_broker_csrf=y"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403 and served.store.stats().parked == parked


def test_messages_in_the_far_tier_are_listed_and_searched_with_the_rest(
    redis_server: EmbeddedRedis, postgres: PostgresServer, page: Page
) -> None:
    """A store with a far tier (PostgreSQL): the message list merges both tiers by due time, and a filter finds
    rows as it finds Redis entries."""
    store = DelayStore(redis_server.client(), namespace=f"webfar-{uuid.uuid4().hex[:8]}", far_tier=postgres.url)
    store.park("soon-ann", Envelope("emails", b'{"args": ["ann"]}', name="send_welcome"), delay=60)
    store.park("later-ann", Envelope("emails", b'{"args": ["ann"]}', name="send_welcome"), delay=30 * 86400)
    store.park("later-bob", Envelope("emails", b'{"args": ["bob"]}', name="send_welcome"), delay=40 * 86400)
    assert store.stats().far == 2
    url, server, thread = serve(create_app(store))
    try:
        page.goto(url + "/messages?state=due")
        assert listed_ids(page) == ["soon-ann", "later-ann", "later-bob"]
        page.goto(url + "/messages?" + urllib.parse.urlencode({"state": "due", "text": "ann"}))
        assert listed_ids(page) == ["soon-ann", "later-ann"]
        page.goto(url + "/messages?" + urllib.parse.urlencode({"state": "due", "from": "+7d", "task": "send_welcome"}))
        assert listed_ids(page) == ["later-ann", "later-bob"]
    finally:
        server.should_exit = True
        thread.join(10)
        assert store.cancel_many(["soon-ann", "later-ann", "later-bob"]) == 3


def page_ids(url: str) -> list[str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return [html.unescape(id) for id in re.findall(r'data-id="([^"]*)"', response.read().decode())]


def test_a_filter_takes_id_prefix_and_text_as_given(redis_server: EmbeddedRedis) -> None:
    """Leading and trailing spaces are part of an id prefix or a text, as for the CLI and Operations.find."""
    with own_dashboard(redis_server) as served:
        served.store.park("  lead-x", Envelope("emails", b'{"args": [" ann"]}'), delay=3600)
        served.store.park("lead-y", Envelope("emails", b'{"args": ["ann"]}'), delay=3601)
        for field, value, expected in [
            ("id_prefix", "  lead", ["  lead-x"]),
            ("id_prefix", "lead", ["lead-y"]),
            ("text", " ann", ["  lead-x"]),
            ("text", "ann", ["  lead-x", "lead-y"]),
            ("id_prefix", "", ["  lead-x", "lead-y"]),
        ]:
            listed = page_ids(served.url + "/messages?" + urllib.parse.urlencode({"state": "due", field: value}))
            found = Operations(served.store).find(MessageFilter(**{field: value or None})).messages
            assert listed == [info.id for info in found] == expected, (field, value)


class HiddenFields(HTMLParser):
    """The hidden inputs of a page: what its form posts back."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "input" and found.get("type") == "hidden" and found.get("name"):
            self.fields[found["name"] or ""] = found.get("value") or ""


def confirm_page(url: str, fields: dict[str, str]) -> dict[str, str]:
    """Ask for an action as the list's bulk form does; the confirm page's form, as its button would post it."""
    with post_form(url + "/actions", fields) as response:
        parser = HiddenFields()
        parser.feed(response.read().decode())
    assert parser.fields["confirmed"] == "yes"
    return parser.fields


BULK_CANCEL = {"scope": "filter", "action": "cancel", "state": "due", "task": "", "id_prefix": "", "text": ""}


def test_a_bulk_action_does_what_was_confirmed_or_nothing(redis_server: EmbeddedRedis) -> None:
    """Confirmed for 5 messages, the submit finds 8 (3 parked meanwhile): nothing is done, and the page says so.
    Confirmed again for 8, all 8 go."""
    with own_dashboard(redis_server) as served:
        for n in range(5):
            served.store.park(f"old-{n}", Envelope("emails", b"{}"), delay=3600)
        bulk = {**BULK_CANCEL, "queue": "emails", "from": "", "to": ""}
        confirmed = confirm_page(served.url, bulk)
        for n in range(3):
            served.store.park(f"new-{n}", Envelope("emails", b"{}"), delay=3600)
        with pytest.raises(urllib.error.HTTPError) as refused:
            post_form(served.url + "/actions", confirmed)
        assert refused.value.code == 409
        assert "now matches 8 message(s), not the 5 you confirmed: nothing was done" in refused.value.read().decode()
        assert served.store.stats().parked == 8

        with post_form(served.url + "/actions", confirm_page(served.url, bulk)) as done:
            assert "8 of 8 message(s) done" in done.read().decode()
        assert served.store.stats().parked == 0


def test_a_bulk_action_refuses_as_many_others_as_were_confirmed(redis_server: EmbeddedRedis) -> None:
    """Confirmed for 2 messages; one is cancelled and another parked before the submit: still 2, but not the 2
    that were confirmed, so nothing is done."""
    with own_dashboard(redis_server) as served:
        for id in ("first", "second"):
            served.store.park(id, Envelope("emails", b"{}"), delay=3600)
        confirmed = confirm_page(served.url, {**BULK_CANCEL, "queue": "emails", "from": "", "to": ""})
        assert served.store.cancel("first")
        served.store.park("newcomer", Envelope("emails", b"{}"), delay=3600)
        with pytest.raises(urllib.error.HTTPError) as refused:
            post_form(served.url + "/actions", confirmed)
        assert refused.value.code == 409
        assert "other messages than the 2 you confirmed" in refused.value.read().decode()
        assert sorted(info.id for info in served.store.iter_all("due")) == ["newcomer", "second"]


def test_a_bulk_run_now_goes_on_past_a_celery_payload_it_cannot_rewrite_and_names_it(
    redis_server: EmbeddedRedis,
) -> None:
    """The other messages run now; the page names the one left as it was, with why (not a 500)."""
    with own_dashboard(redis_server) as served:
        celery = Celery("web-bad-payload", broker=redis_server.url, set_as_current=False)
        install(celery, threshold=1.0, namespace=served.store.keys.namespace)
        for n in range(3):
            celery.send_task("tasks.bill", args=[n], countdown=3600, task_id=f"bill-{n}")
        celery.close()
        served.store.park("bad", Envelope("celery", b"\x80not json", framework="celery", name="tasks.bill"), delay=3600)
        before = served.store.get("bad")
        bulk = {**BULK_CANCEL, "action": "run_now", "task": "tasks.bill", "queue": "", "from": "", "to": ""}
        by_ids = {"action": "run_now", "ids": '["bill-0", "bad"]', "confirmed": "yes"}
        for form, summary in ((confirm_page(served.url, bulk), "3 of 4"), (by_ids, "1 of 2")):
            with post_form(served.url + "/actions", form) as done:
                text = html.unescape(done.read().decode())
            assert f"{summary} message(s) done." in text and "no longer there" not in text
            assert "1 message(s) could not be rewritten" in text and "UnicodeDecodeError" in text
            assert '<code class="message-id">bad</code>' in text
        assert served.store.stats().overdue == 3 and served.store.get("bad") == before


@pytest.mark.parametrize("count", ["²", "٣", "1e3", "-1", ""])
def test_a_confirmed_count_that_is_not_a_number_is_refused(redis_server: EmbeddedRedis, count: str) -> None:
    """The count the confirm page carries is ASCII digits; anything else (even what str.isdigit takes) is a
    form that does not say what was confirmed: a 400, whether the digest still matches or not."""
    with own_dashboard(redis_server) as served:
        served.store.park("kept", Envelope("emails", b"{}"), delay=3600)
        confirmed = confirm_page(served.url, {**BULK_CANCEL, "queue": "emails", "from": "", "to": ""})
        for digest in (confirmed["digest"], "other"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                post_form(served.url + "/actions", {**confirmed, "count": count, "digest": digest})
            assert refused.value.code == 400, digest
            assert "does not say which messages were confirmed: nothing was done" in refused.value.read().decode()
        assert served.store.get("kept") is not None


def test_a_relative_window_means_the_instants_it_meant_when_confirmed(redis_server: EmbeddedRedis) -> None:
    """``to=2s`` confirmed is the instant 2 s after the confirm page was made, not 2 s after the submit."""
    with own_dashboard(redis_server) as served:
        served.store.park("within", Envelope("emails", b"{}"), delay=1)
        served.store.park("after", Envelope("emails", b"{}"), delay=3)
        confirmed = confirm_page(served.url, {**BULK_CANCEL, "queue": "", "from": "", "to": "2s"})
        time.sleep(1.5)  # "2s" read again at the submit would take in "after" too
        with post_form(served.url + "/actions", confirmed) as done:
            assert "1 of 1 message(s) done" in done.read().decode()
        assert [info.id for info in served.store.iter_all("due")] == ["after"]


def test_the_confirm_page_shows_an_id_as_text_and_acts_on_it(redis_server: EmbeddedRedis, page: Page) -> None:
    """Non-ASCII, quotes, & and markup in an id: shown as they are (not as JSON escapes, not as HTML), and
    the action still names that very message."""
    target = 'ünï©ødé "quoted" & <b>bold</b>'
    with own_dashboard(redis_server) as served:
        served.store.park(target, Envelope("emails", b"{}"), delay=3600)
        served.store.park("ünï©ødé", Envelope("emails", b"{}"), delay=3600)
        page.goto(served.url + "/message?" + urllib.parse.urlencode({"id": target}))
        page.click("#single-cancel")
        assert page.locator("#confirm-ids").inner_text() == target
        assert page.locator("#confirm-ids b").count() == 0
        page.click("#confirm")
        assert "1 of 1" in page.locator("#result").inner_text()
        assert [info.id for info in served.store.iter_all("due")] == ["ünï©ødé"]
