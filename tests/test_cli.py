"""The ``delay-broker`` command against a real redis-server: parked, in-flight and dead messages of both
frameworks, human and ``--json`` output, confirmations of destructive commands, and the promote command."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.cli import cli, common, run_until_signalled, serve
from delay_broker.cli.format import (
    bar,
    format_relative,
    format_span,
    parse_duration,
    parse_iso,
    parse_when,
    printable,
)
from delay_broker.clock import MAX_DUE_MS, due_to_ms, iso_time, ms_to_datetime
from delay_broker.decoding import decode_payload
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import EmbeddedRedis, free_port

from .helpers import celery_envelope, dramatiq_envelope, wait_for

# -- messages as the two adapters park them ------------------------------------------------------------------------


def celery_amqp_envelope(task: str, task_id: str) -> Envelope:
    """A Celery task as the AMQP transport keeps it: body (base64) + properties + exchange + routing key."""
    body = json.dumps([[1], {}, {}]).encode()
    record = {
        "body": base64.b64encode(body).decode(),
        "properties": {
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "application_headers": {"task": task, "id": task_id},
        },
        "exchange": "",
        "routing_key": "celery",
    }
    return Envelope(route="celery", payload=json.dumps(record).encode(), framework="celery", name=task)


def populate(store: DelayStore) -> dict[str, str]:
    """Parked (future and overdue), in-flight and dead messages of both frameworks. Returns id -> state."""
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    # In flight: claimed by a promoter that has not acknowledged them.
    store.park("dq-inflight", dramatiq_envelope("send_email", "dq-inflight"), due=past)
    store.park("cl-inflight", celery_envelope("tasks.add", "cl-inflight"), due=past)
    claim = store.claim(10, 60, "cli-test-promoter")
    assert {m.id for m in claim.messages} == {"dq-inflight", "cl-inflight"}
    # Dead: claimed, then refused.
    store.park("dq-dead", dramatiq_envelope("charge_card", "dq-dead", queue="payments"), due=past)
    store.park("cl-dead", celery_amqp_envelope("tasks.report", "cl-dead"), due=past)
    dead = store.claim(10, 60, "cli-test-promoter")
    outcomes = store.nack(
        dead.lease_deadline_ms,
        [(m.id, f"delivery refused: no queue for {m.id}", "dead") for m in dead.messages],
    )
    assert outcomes == ["dead", "dead"]
    # Parked: overdue (nobody promotes this namespace) and due later.
    store.park("dq-overdue", dramatiq_envelope("send_email", "dq-overdue"), due=past)
    store.park("dq-soon", dramatiq_envelope("send_email", "dq-soon"), delay=30)
    store.park("cl-hour", celery_envelope("tasks.add", "cl-hour"), delay=2 * 3600)
    store.park("cl-later", celery_envelope("tasks.add", "cl-later", queue="reports"), delay=3 * 86400)
    store.park(
        "raw-binary", Envelope(route="bin", payload=b"\x80\x04\x95pickle\x1b[31m", framework="dramatiq"), delay=600
    )
    return {
        "dq-inflight": "inflight",
        "cl-inflight": "inflight",
        "dq-dead": "dead",
        "cl-dead": "dead",
        "dq-overdue": "due",
        "dq-soon": "due",
        "cl-hour": "due",
        "cl-later": "due",
        "raw-binary": "due",
    }


@pytest.fixture
def populated(store: DelayStore) -> dict[str, str]:
    return populate(store)


@pytest.fixture
def run(redis_server: EmbeddedRedis, namespace: str) -> Any:
    """Invoke ``delay-broker ARGS`` in-process, with the Redis URL and namespace from the environment."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        environment = {"DELAY_BROKER_REDIS_URL": redis_server.url, "DELAY_BROKER_NAMESPACE": namespace}
        environment.update(env or {})
        return runner.invoke(cli, list(args), input=input, env=environment, catch_exceptions=False)

    return invoke


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- help ----------------------------------------------------------------------------------------------------------


def test_group_help_points_a_new_user_at_stats_and_dead_requeue(run):
    result = run("--help")
    assert result.exit_code == 0
    for expected in ("stats", "dead requeue", "DELAY_BROKER_REDIS_URL", "--namespace", "--json", "promote"):
        assert expected in result.output
    commands_section = result.output.split("Commands:")[1]
    assert commands_section.index("stats") < commands_section.index("ls")  # most used first, not alphabetical
    dead_help = run("dead", "--help").output
    assert "requeue" in dead_help and "purge" in dead_help
    requeue_help = run("dead", "requeue", "--help").output
    assert "--all" in requeue_help and "--yes" in requeue_help and "--redis-url" in requeue_help
    for command in (["stats"], ["ls"], ["show"], ["cancel"], ["reschedule"], ["dead", "ls"], ["promote"], ["metrics"]):
        text = run(*command, "--help").output
        assert "Usage: " in text and len(text.splitlines()) > 5, command


def test_a_missing_redis_url_is_a_clear_usage_error(namespace):
    result = CliRunner().invoke(cli, ["stats"], env={"DELAY_BROKER_REDIS_URL": ""})
    assert result.exit_code == 2
    assert "--redis-url" in result.output and "DELAY_BROKER_REDIS_URL" in result.output


def test_an_unreachable_redis_is_one_line_not_a_traceback(namespace):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(cli, ["stats", "--redis-url", url, "-n", namespace])
    assert result.exit_code == 1
    assert "Error:" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("namespace", ["a{b}", "orders#1", "orders#1.2"])
def test_a_bad_namespace_is_a_usage_error(redis_server, namespace):
    """Braces break the hash tag; a name ending like a shard's tag (orders#1) would share the keys of a shard of
    another namespace (orders, sharded)."""
    result = CliRunner().invoke(cli, ["stats", "--redis-url", redis_server.url, "--namespace", namespace])
    assert result.exit_code == 2 and "namespace" in result.output
    assert CliRunner().invoke(cli, ["stats", "--redis-url", redis_server.url, "--namespace", "team#a"]).exit_code == 0


# -- stats ---------------------------------------------------------------------------------------------------------


def test_stats_json_counts_every_state_and_buckets_parked_by_due_time(run, populated):
    data = as_json(run("stats", "--json"))
    assert (data["parked"], data["inflight"], data["dead"], data["overdue"]) == (5, 2, 2, 1)
    assert data["histogram"] == {"overdue": 1, "next_minute": 1, "next_hour": 1, "next_day": 1, "later": 1}
    assert 4 * 60_000 < data["oldest_overdue_age_ms"] < 10 * 60_000
    assert data["live_promoters"] == 1  # the test's claims left a heartbeat
    assert data["counters"]["parked"] == 9 and data["counters"]["dead_lettered"] == 2
    assert data["next_due"].endswith("Z") and data["next_due_ms"] < data["now_ms"]


def test_stats_table_shows_counts_and_a_histogram_with_bars(run, populated, redis_server, namespace):
    # Also with the options instead of the environment.
    result = run("stats", "--redis-url", redis_server.url, "--namespace", namespace, env={"DELAY_BROKER_REDIS_URL": ""})
    assert result.exit_code == 0, result.output
    out = result.output
    assert namespace in out
    rows: dict[str, str] = {}
    for line in out.splitlines():
        if line.count("│") >= 3:  # the first table (the counters table repeats "parked")
            rows.setdefault(line.split("│")[1].strip(), line.split("│")[2].strip())
    assert (rows["parked"], rows["in flight"], rows["dead"], rows["overdue"], rows["live promoters"]) == (
        "5",
        "2",
        "2",
        "1",
        "1",
    )
    assert "delay-broker dead ls" in out
    for label in ("overdue", "within 1 minute", "1 minute to 1 hour", "1 hour to 1 day", "later"):
        line = next(line for line in out.splitlines() if label in line and "█" in line)
        assert " 1 " in line
    assert rows["oldest overdue age"].startswith(("4m", "5m")) and rows["parked"] == "5"


def test_stats_say_how_many_parked_messages_are_packed(run, store):
    ids = [str(uuid.uuid4()) for _ in range(3)]
    store.park_many([ParkRequest(id, Envelope("ready", b"x"), delay=3600) for id in ids])
    store.park("near", Envelope("ready", b"x"), delay=3600)  # not a UUID: the ordinary layout
    assert (as_json(run("stats", "--json"))["parked"], as_json(run("stats", "--json"))["packed"]) == (4, 3)
    assert "3 of them in packs" in run("stats").output
    listed = as_json(run("ls", "--json"))["messages"]
    assert sorted(message["id"] for message in listed) == sorted([*ids, "near"])


def test_stats_of_an_empty_namespace_warns_of_no_promoter_only_when_needed(run):
    result = run("stats")
    assert result.exit_code == 0
    assert "nothing parked" in result.output
    assert as_json(run("stats", "--json"))["parked"] == 0


# -- ls ------------------------------------------------------------------------------------------------------------


def test_ls_lists_parked_messages_by_due_time_with_framework_queue_name_attempts(run, populated):
    result = run("ls")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith(("dq-", "cl-", "raw-"))]
    ids = [line.split()[0] for line in lines]
    assert ids == ["dq-overdue", "dq-soon", "raw-binary", "cl-hour", "cl-later"]
    header = next(line for line in result.output.splitlines() if line.startswith("id "))
    for column in ("id", "due", "framework", "queue", "name"):
        assert column in header
    assert "attempts" not in header  # none of them failed a delivery: the column would be all zeros
    dead_header = next(line for line in run("ls", "dead").output.splitlines() if line.startswith("id "))
    assert "attempts" in dead_header and "error" in dead_header
    cl_later = next(line for line in lines if "cl-later" in line)
    assert "celery" in cl_later and "reports" in cl_later and "tasks.add" in cl_later and "in 3d" in cl_later
    assert "ago" in next(line for line in lines if "dq-overdue" in line)
    assert "\x1b" not in result.output


def test_ls_pages_by_cursor_so_that_promotions_meanwhile_skip_nothing(run, store):
    for n in range(6):
        store.park(f"m{n}", dramatiq_envelope("send_email", f"m{n}"), delay=60 + n)
    first = as_json(run("ls", "--json", "--limit", "2"))
    assert [m["id"] for m in first["messages"]] == ["m0", "m1"] and first["next_cursor"]
    assert store.cancel_each(["m0", "m1"]) == [True, True]  # as if promoted: the head moves on
    second = as_json(run("ls", "--json", "--limit", "2", "--cursor", first["next_cursor"]))
    assert [m["id"] for m in second["messages"]] == ["m2", "m3"], "an offset of 2 would have skipped them"
    footer = run("ls", "--limit", "2").output
    assert "Next page: --cursor " in footer


def test_ls_json_pages_and_filters_by_due_range(run, populated):
    first = as_json(run("ls", "--json", "--limit", "2"))
    assert [m["id"] for m in first["messages"]] == ["dq-overdue", "dq-soon"]
    assert first["next_offset"] == 2
    message = first["messages"][1]
    assert message["framework"] == "dramatiq" and message["route"] == "default" and message["name"] == "send_email"
    assert message["state"] == "due" and message["attempts"] == 0 and message["due"].endswith("Z")
    second = as_json(run("ls", "--json", "--limit", "2", "--offset", "2"))
    assert [m["id"] for m in second["messages"]] == ["raw-binary", "cl-hour"]
    last = as_json(run("ls", "--json", "--limit", "2", "--offset", "4"))
    assert [m["id"] for m in last["messages"]] == ["cl-later"] and last["next_offset"] is None
    # Relative ranges, on the Redis clock.
    within_hour = as_json(run("ls", "--json", "--from", "now", "--to", "1h"))
    assert [m["id"] for m in within_hour["messages"]] == ["dq-soon", "raw-binary"]
    overdue = as_json(run("ls", "--json", "--to", "now"))
    assert [m["id"] for m in overdue["messages"]] == ["dq-overdue"]
    later = as_json(run("ls", "--json", "--from", "1d"))
    assert [m["id"] for m in later["messages"]] == ["cl-later"]
    # ISO bounds.
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    iso = as_json(run("ls", "--json", "--from", "-1h", "--to", tomorrow))
    assert [m["id"] for m in iso["messages"]] == ["dq-overdue", "dq-soon", "raw-binary", "cl-hour"]


def test_ls_inflight_and_dead(run, populated):
    inflight = as_json(run("ls", "inflight", "--json"))
    assert {m["id"] for m in inflight["messages"]} == {"dq-inflight", "cl-inflight"}
    assert all(m["lease_deadline_ms"] and m["state"] == "inflight" for m in inflight["messages"])
    table = run("ls", "inflight").output
    assert "lease until" in table and "dq-inflight" in table and "cl-inflight" in table
    dead = as_json(run("ls", "dead", "--json"))
    by_id = {m["id"]: m for m in dead["messages"]}
    assert set(by_id) == {"dq-dead", "cl-dead"}
    assert by_id["dq-dead"]["error"].startswith("delivery refused: no queue for dq-dead")
    assert by_id["dq-dead"]["route"] == "payments" and by_id["cl-dead"]["name"] == "tasks.report"


def test_ls_refuses_a_bad_range_and_says_when_empty(run, populated):
    bad = run("ls", "--from", "yesterday-ish")
    assert bad.exit_code == 2 and "cannot read" in bad.output
    backwards = run("ls", "--from", "2h", "--to", "1h")
    assert backwards.exit_code == 2
    empty = run("ls", "--from", "30d")
    assert empty.exit_code == 0 and "No parked messages in that range" in empty.output


# -- show ----------------------------------------------------------------------------------------------------------


def test_show_decodes_a_dramatiq_message(run, populated):
    data = as_json(run("show", "dq-soon", "--json"))
    assert data["state"] == "due" and data["envelope"]["framework"] == "dramatiq"
    assert data["envelope"]["hash_field"] == "rid-dq-soon"
    assert data["payload"]["format"] == "json"
    assert data["payload"]["message"]["actor_name"] == "send_email"
    assert data["payload"]["message"]["kwargs"] == {"to": "ops@example.com"}
    assert json.loads(base64.b64decode(data["payload_base64"]))["message_id"] == "dq-soon"
    text = run("show", "dq-soon").output
    assert "send_email" in text and '"actor_name"' in text and "ops@example.com" in text and "in " in text


def test_show_decodes_a_celery_message_and_its_base64_body(run, populated):
    data = as_json(run("show", "cl-hour", "--json"))
    payload = data["payload"]
    assert payload["message"]["headers"]["task"] == "tasks.add"
    assert payload["body"]["format"] == "json"
    assert payload["body"]["value"][0] == [2, 3] and payload["body"]["value"][1] == {"retry": True}
    text = run("show", "cl-hour").output
    assert "Celery message body, decoded (application/json)" in text and '"retry": true' in text


def test_show_a_parked_at_time_past_what_a_datetime_holds(run, store):
    """The binary header holds a producer's parked-at up to the year 10889: shown at the edge, not a traceback."""
    store.park("far-clock", Envelope("emails", b"{}", parked_at_ms=(1 << 48) - 1), delay=60)
    assert as_json(run("show", "far-clock", "--json"))["envelope"]["parked_at"].startswith("9999-12-30T")
    assert "9999-12-30" in run("show", "far-clock").output


def test_show_in_flight_and_dead_messages(run, populated):
    inflight = as_json(run("show", "cl-inflight", "--json"))
    assert inflight["state"] == "inflight" and inflight["lease_deadline_ms"] > 0 and inflight["due_ms"] > 0
    assert "lease until" in run("show", "dq-inflight").output
    dead = as_json(run("show", "cl-dead", "--json"))
    assert dead["state"] == "dead" and dead["error"].startswith("delivery refused")
    assert dead["payload"]["body"]["value"] == [[1], {}, {}]  # AMQP record: body always base64


def test_show_binary_payload_is_escaped_never_unpickled_and_never_reaches_the_terminal_raw(run, populated):
    data = as_json(run("show", "raw-binary", "--json"))
    assert data["payload"]["format"] == "binary"
    assert base64.b64decode(data["payload"]["base64"]) == b"\x80\x04\x95pickle\x1b[31m"
    text = run("show", "raw-binary").output
    assert "\\x80\\x04\\x95pickle\\x1b[31m" in text and "\x1b" not in text


@pytest.mark.parametrize("depth", [900, 5000])
def test_show_and_search_survive_a_payload_nested_thousands_deep(run, store: DelayStore, depth: int):
    deep = b"[" * depth + b'"\xc3\xa9"' + b"]" * depth  # JSON that only a deep enough parser takes
    body = base64.b64encode(deep).decode()
    celery = json.dumps({"body": body, "content-type": "application/json", "properties": {"body_encoding": "base64"}})
    store.park("deep-dramatiq", Envelope("default", deep, framework="dramatiq"), delay=60)
    store.park("deep-celery", Envelope("celery", celery.encode(), framework="celery"), delay=60)
    for id in ("deep-dramatiq", "deep-celery"):
        assert run("show", id).exit_code == 0
        assert as_json(run("show", id, "--json"))["id"] == id
    found = as_json(run("ls", "--json", "--text", "é"))
    assert {m["id"] for m in found["messages"]} <= {"deep-dramatiq", "deep-celery"}


@pytest.mark.parametrize("id", ["job[/]1", "[red]alert[/red]", "[link=http://x]y"])
def test_ids_and_filters_with_rich_markup_are_shown_as_they_are(run, store: DelayStore, id: str):
    store.park(id, Envelope("[b]queue", b"{}", name="[i]task"), delay=60)
    shown = run("show", id)
    assert shown.exit_code == 0 and f"message {id!r}" in shown.output
    listed = run("ls", "--queue", "[b]queue")
    assert listed.exit_code == 0 and "matching queue '[b]queue'" in listed.output
    assert run("stats").exit_code == 0


def test_json_output_is_strict_json_even_for_a_payload_holding_nan(run, store: DelayStore):
    """Python's JSON reads NaN and Infinity in a Dramatiq message; the CLI's JSON must not print them bare."""
    store.park("nan", Envelope("q", b'{"args": [NaN, Infinity, -Infinity, [1.5]]}', framework="dramatiq"), delay=60)
    output = run("show", "nan", "--json").output
    decoded = json.loads(output, parse_constant=lambda word: pytest.fail(f"bare {word} in the output"))
    assert decoded["payload"]["message"]["args"] == ["NaN", "Infinity", "-Infinity", [1.5]]


@pytest.mark.parametrize("option", ["--celery", "--dramatiq"])
def test_promote_given_something_else_than_an_app_says_so(run, option):
    result = CliRunner().invoke(cli, ["promote", option, "os:path"])
    assert result.exit_code == 2 and "not a" in result.output and "Traceback" not in result.output


def test_web_on_a_taken_port_exits_with_the_cli_s_code(run):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        result = run("web", "--port", str(taken.getsockname()[1]))
    finally:
        taken.close()
    assert result.exit_code == 1 and "could not serve" in result.output


def test_show_unknown_id_fails_clearly(run, populated):
    result = run("show", "nope")
    assert result.exit_code == 1 and "no message 'nope'" in result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["show", "\udcff\udcfe"], "'ID'"),
        (["cancel", "--yes", "\udcff\udcfe"], "'[ID]...'"),
        (["cancel", "--yes", "dq-soon", "m1\udcff"], "'[ID]...'"),
        (["reschedule", "\udcff", "--now"], "'[ID]'"),
        (["dead", "show", "\udcff"], "'ID'"),
        (["dead", "requeue", "dq-dead", "\udcff"], "'[ID]...'"),
        (["dead", "purge", "--yes", "\udcff"], "'[ID]...'"),
        (["ls", "--id-prefix", "\udcff"], "'--id-prefix'"),
        (["ls", "dead", "--queue", "\udcff"], "'--queue'"),
        (["cancel", "--yes", "--id-prefix", "\udcff"], "'--id-prefix'"),
        (["reschedule", "--task", "\udcff", "--now", "--yes"], "'--task'"),
    ],
)
def test_text_that_is_not_utf8_is_a_usage_error_naming_its_argument(run, populated, store, args, named):
    """Bytes that are not UTF-8 on the command line (surrogates to Python) are refused before anything is done,
    naming the argument, not with a traceback from the Redis client nor as a bad --cursor."""
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {named}:" in result.output and "is not valid UTF-8" in result.output
    assert "Traceback" not in result.output and "--cursor" not in result.output
    assert (store.get("dq-soon").state, store.get("dq-dead").state) == ("due", "dead"), "nothing was done"


# -- cancel / reschedule -----------------------------------------------------------------------------------------


def test_cancel_refuses_without_confirmation_when_not_interactive(run, populated, store):
    result = run("cancel", "dq-soon")
    assert result.exit_code == 1 and "--yes" in result.output
    assert store.get("dq-soon").state == "due"


def test_cancel_asks_at_a_terminal_and_does_nothing_on_no(run, populated, store, monkeypatch):
    monkeypatch.setattr(common, "interactive", lambda: True)
    declined = run("cancel", "dq-soon", input="n\n")
    assert declined.exit_code == 1 and "Cancel message 'dq-soon'" in declined.output
    assert store.get("dq-soon") is not None
    accepted = run("cancel", "dq-soon", input="y\n")
    assert accepted.exit_code == 0 and "Cancelled" in accepted.output
    assert store.get("dq-soon") is None


def test_cancel_with_yes_and_json(run, populated, store):
    assert as_json(run("cancel", "cl-later", "--yes", "--json")) == {
        "id": "cl-later",
        "cancelled": True,
        "state": "due",
    }
    assert store.get("cl-later") is None
    inflight = run("cancel", "dq-inflight", "--yes")
    assert inflight.exit_code == 1 and "being promoted" in inflight.output
    gone = run("cancel", "cl-later", "--yes")
    assert gone.exit_code == 1 and "no message" in gone.output


def test_reschedule_packs_as_the_application_does(run, client, namespace):
    """--pack-after / DELAY_BROKER_PACK_AFTER: 'none' for applications that pack nothing (a rolling upgrade from a
    release whose promoters do not open packs); the default packs a move 20 minutes ahead."""
    plain = DelayStore(client, namespace=namespace, pack_after=None)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    plain.park_many([ParkRequest(id, Envelope("ready", b"x"), delay=60) for id in ids])
    assert run("reschedule", ids[0], "--in", "20m", "--pack-after", "none").exit_code == 0
    assert run("reschedule", ids[1], "--in", "20m", env={"DELAY_BROKER_PACK_AFTER": "None"}).exit_code == 0
    assert plain.stats().packed == 0
    assert run("reschedule", ids[2], "--in", "20m").exit_code == 0
    assert plain.stats().packed == 1
    for wrong in ("5", "soon", "inf"):
        result = run("reschedule", ids[0], "--in", "20m", "--pack-after", wrong)
        assert result.exit_code == 2 and "--pack-after" in result.output, result.output


def test_reschedule_in_at_and_now(run, populated, store):
    before = store.stats().now_ms
    moved = as_json(run("reschedule", "cl-later", "--in", "5m", "--json"))
    assert 295_000 <= moved["due_ms"] - before <= 310_000
    assert store.get("cl-later").due_ms == moved["due_ms"]
    at = as_json(run("reschedule", "cl-later", "--at", "2031-02-03T04:05:06+01:00", "--json"))
    assert at["due"] == "2031-02-03T03:05:06.000Z"
    # A Celery task's eta header moves with it, or a worker would hold it until the old eta.
    stored = json.loads(store.get("cl-later").envelope.payload)
    assert stored["headers"]["eta"] == "2031-02-03T03:05:06+00:00"
    assert stored["body"] == json.loads(celery_envelope("x", "y").payload)["body"], "the body is untouched"
    now = run("reschedule", "cl-later", "--now")
    assert now.exit_code == 0 and "Rescheduled 'cl-later'" in now.output
    assert store.stats().overdue >= 1
    assert run("reschedule", "cl-later").exit_code == 2  # none of --in/--at/--now
    assert run("reschedule", "cl-later", "--in", "5m", "--now").exit_code == 2
    assert run("reschedule", "cl-later", "--in", "soon").exit_code == 2
    dead = run("reschedule", "dq-dead", "--now")
    assert dead.exit_code == 1 and "dead requeue" in dead.output


# -- dead ------------------------------------------------------------------------------------------------------------


def test_dead_ls_and_show(run, populated):
    table = run("dead", "ls").output
    assert "dq-dead" in table and "cl-dead" in table and "delivery refused" in table and "error" in table
    data = as_json(run("dead", "ls", "--json", "--from", "-1h"))
    assert {m["id"] for m in data["messages"]} == {"dq-dead", "cl-dead"}
    shown = as_json(run("dead", "show", "dq-dead", "--json"))
    assert shown["payload"]["message"]["actor_name"] == "charge_card" and shown["attempts"] >= 0
    assert "no queue for dq-dead" in run("dead", "show", "dq-dead").output
    not_dead = run("dead", "show", "dq-soon")
    assert not_dead.exit_code == 1 and "not dead-lettered" in not_dead.output


def test_dead_requeue_by_id_needs_no_confirmation(run, populated, store):
    result = as_json(run("dead", "requeue", "dq-dead", "--json"))
    assert result == {"requeued": 1, "not_requeued": []}
    info = store.get("dq-dead")
    assert info.state == "due" and info.attempts == 0
    partly = run("dead", "requeue", "cl-dead", "dq-soon")
    assert partly.exit_code == 1 and "Requeued 1" in partly.output and "'dq-soon'" in partly.output
    assert "'cl-dead'" not in partly.output.split("Requeued 1", 1)[1], (
        "the one just requeued is not reported as left alone"
    )


def test_dead_requeue_all_refuses_without_confirmation_then_requeues(run, populated, store, monkeypatch):
    refused = run("dead", "requeue", "--all")
    assert refused.exit_code == 1 and "--yes" in refused.output
    assert store.stats().dead == 2
    assert run("dead", "requeue").exit_code == 2  # neither ids nor --all
    monkeypatch.setattr(common, "interactive", lambda: True)
    asked = run("dead", "requeue", "--all", input="y\n")
    assert asked.exit_code == 0 and "Requeue all 2 dead-lettered" in asked.output and "Requeued 2" in asked.output
    assert store.stats().dead == 0 and store.get("cl-dead").state == "due"


def test_dead_requeue_all_names_the_dead_letters_it_could_not_requeue(run, populated, store, client):
    client.hdel(store.keys.msg, "dq-dead")  # its payload gone: nothing to run again
    result = run("dead", "requeue", "--all", "--yes", "--json")
    assert result.exit_code == 1
    # click < 8.2 writes stderr into result.stdout too: the JSON document comes first either way
    report, _ = json.JSONDecoder().raw_decode(result.stdout)
    assert report == {"requeued": 1, "not_requeued": ["dq-dead"]}
    assert "Not requeued" in result.output
    assert store.get("dq-dead").state == "dead"


def test_dead_purge_refuses_without_confirmation_then_purges(run, populated, store):
    refused = run("dead", "purge")
    assert refused.exit_code == 1 and "--yes" in refused.output and store.stats().dead == 2
    refused_ids = run("dead", "purge", "dq-dead")
    assert refused_ids.exit_code == 1 and store.stats().dead == 2
    assert as_json(run("dead", "purge", "dq-dead", "--yes", "--json")) == {"purged": 1}
    assert store.get("dq-dead") is None
    everything = run("dead", "purge", "--yes")
    assert everything.exit_code == 0 and "Purged 1" in everything.output
    assert store.stats().dead == 0
    assert as_json(run("dead", "purge", "--json")) == {"purged": 0}  # nothing to confirm


def test_ids_given_and_not_acted_on_fail_the_command(run, populated, store):
    """As ``cancel ID`` and ``dead requeue ID...`` do: exit status 1, naming (or counting) what was left."""
    partly = run("cancel", "dq-soon", "nosuch", "--yes", "--json")
    assert partly.exit_code == 1
    report, _ = json.JSONDecoder().raw_decode(partly.stdout)
    assert report == {"cancelled": 1, "not_cancelled": ["nosuch"]}
    assert "Not cancelled (unknown, promoted or in flight): 'nosuch'" in partly.output
    assert run("cancel", "cl-hour", "cl-later", "--yes").exit_code == 0
    purged = run("dead", "purge", "dq-dead", "dq-overdue", "dq-dead", "--yes", "--json")
    assert purged.exit_code == 1
    assert json.JSONDecoder().raw_decode(purged.stdout)[0] == {"purged": 1}
    assert "Not purged: 1 of the given IDs" in purged.output
    assert store.get("dq-overdue").state == "due" and store.get("dq-dead") is None
    assert run("dead", "purge", "cl-dead", "--yes").exit_code == 0


# -- promote and metrics -------------------------------------------------------------------------------------------


def test_promote_runs_the_app_promoter_with_a_metrics_endpoint(run, store, client, namespace, monkeypatch):
    logger = logging.getLogger("delay_broker")
    monkeypatch.setattr(logger, "level", logger.level)  # --log-level sets it; put it back afterwards
    ready = f"{namespace}:jobs:ready"
    store.park("job-1", Envelope(route="ready", payload=b"1"), delay=0)
    store.park("job-2", Envelope(route="nowhere", payload=b"2"), delay=0)
    store.park("job-3", Envelope(route="ready", payload=b"3"), delay=3600)
    promoter = Promoter(store, DirectLists({"ready": ListTarget(ready)}), max_idle=0.5)
    built: list[tuple[Any, ...]] = []

    def build(dramatiq_broker: str | None, celery_app: str | None, overrides: dict[str, Any]) -> Promoter:
        built.append((dramatiq_broker, celery_app, overrides))
        return promoter

    monkeypatch.setattr(serve, "build_app_promoter", build)
    port = free_port()
    scraped: dict[str, str] = {}

    def scrape_then_stop() -> None:
        try:
            wait_for(lambda: client.llen(ready) == 1, timeout=10)

            def fetch() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                        scraped["text"] = response.read().decode()
                except OSError:
                    return False
                labels = '{namespace="' + namespace + '"} 1.0'
                # Promoted and dead-lettered are counted one after the other: a scrape may fall between.
                wanted = ("delay_broker_promoted_total", "delay_broker_dead_lettered_total")
                return all(name + labels in scraped["text"] for name in wanted)

            wait_for(fetch, timeout=10, interval=0.05)
        finally:
            promoter.request_stop()
            store.wake(promoter.id)

    helper = threading.Thread(target=scrape_then_stop)
    helper.start()
    result = run(
        "promote", "--dramatiq", "app:broker", "--batch", "10", "--metrics-port", str(port), "--log-level", "warning"
    )
    helper.join(15)
    assert result.exit_code == 0, result.output
    assert built == [("app:broker", None, {"batch": 10})]
    text = scraped["text"]
    labels = f'{{namespace="{namespace}"}}'
    assert f"delay_broker_promoted_total{labels} 1.0" in text
    assert f"delay_broker_dead_lettered_total{labels} 1.0" in text
    assert f"delay_broker_parked_messages{labels} 1.0" in text
    assert f"delay_broker_dead_messages{labels} 1.0" in text
    assert f"delay_broker_live_promoters{labels} 1.0" in text
    with pytest.raises(OSError):  # the endpoint stopped with the promoter
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_promote_needs_exactly_one_application(run):
    assert run("promote").exit_code == 2
    assert run("promote", "--dramatiq", "a:b", "--celery", "c:d").exit_code == 2


def test_metrics_print_shows_the_backlog_of_several_namespaces(run, populated, redis_server, namespace):
    result = run("metrics", "--print", "-n", namespace, "-n", "other-" + namespace)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert f'delay_broker_parked_messages{{namespace="{namespace}"}} 5.0' in text
    assert f'delay_broker_inflight_messages{{namespace="{namespace}"}} 2.0' in text
    assert f'delay_broker_parked_messages{{namespace="other-{namespace}"}} 0.0' in text
    assert f'delay_broker_store_up{{namespace="{namespace}"}} 1.0' in text


PROMOTE_UNTIL_SIGNALLED = """
import sys
import redis
from delay_broker import DelayStore, ListTarget, Promoter
from delay_broker.cli import run_until_signalled
from delay_broker.deliverers import DirectLists

store = DelayStore(redis.Redis.from_url(sys.argv[1], socket_timeout=None), namespace=sys.argv[2])
promoter = Promoter(store, DirectLists({"ready": ListTarget("ready")}), max_idle=120)
print("ready", flush=True)
run_until_signalled(promoter, log_level="WARNING")
print("stopped", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_an_idle_promoter_at_once_not_after_max_idle(redis_server, namespace, signum):
    """``delay-broker promote`` asleep in a BLPOP of up to max_idle (120 s here, with no socket timeout to cut it
    short) stops when told to."""
    command = [sys.executable, "-c", PROMOTE_UNTIL_SIGNALLED, redis_server.url, namespace]
    client = redis_server.client()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        wait_for(lambda: client.zcard(DelayStore(client, namespace=namespace).keys.promoters) == 1, timeout=20)
        time.sleep(0.3)  # into its sleep
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert stdout.strip() == "stopped"
    assert client.zcard(DelayStore(client, namespace=namespace).keys.promoters) == 0, "deregistered"


def test_a_promoter_that_crashes_is_raised_by_run_until_signalled(store):
    """So that ``delay-broker promote`` exits non-zero, and a supervisor restarts it."""

    class Crashing(Promoter):
        def run(self) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_until_signalled(Crashing(store, DirectLists({"ready": ListTarget("ready")})), log_level=None)


def test_metrics_command_serves_http_until_terminated(redis_server, populated, namespace):
    port = free_port()
    env = {**os.environ, "DELAY_BROKER_REDIS_URL": redis_server.url, "DELAY_BROKER_NAMESPACE": namespace}
    command = [sys.executable, "-c", "from delay_broker.cli import main; main()", "metrics", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scraped: dict[str, str] = {}

    def fetch() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                scraped["text"] = response.read().decode()
        except OSError:
            return process.poll() is not None  # stop waiting if it died
        return True

    try:
        wait_for(fetch, timeout=20, interval=0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert f'delay_broker_dead_messages{{namespace="{namespace}"}} 2.0' in scraped["text"]
    assert "process_cpu_seconds_total" in scraped["text"]  # the default registry: process metrics too
    assert f"127.0.0.1:{port}/metrics" in stderr


# -- parsing and formatting ----------------------------------------------------------------------------------------


def test_durations_and_times():
    assert parse_duration("90") == 90 and parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("2d") == 172800 and parse_duration("1w") == 604800 and parse_duration("250ms") == 0.25
    for bad in ("", "soon", "5x", "-5m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    now = 1_700_000_000_000
    assert parse_when("now", now) == now and parse_when("5m", now) == now + 300_000
    assert parse_when("-1h", now) == now - 3_600_000 and parse_when("+2d", now) == now + 172_800_000
    assert parse_when("2030-01-01", now) == int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    assert parse_when("20300101", now) == parse_when("2030-01-01", now), "a compact date, not 20 million seconds"
    for out_of_range in ("99999999w", "-99999999w"):
        with pytest.raises(ValueError, match="out of range"):
            parse_when(out_of_range, now)
    assert parse_iso("2030-01-01T10:00:00Z") == datetime(2030, 1, 1, 10, tzinfo=timezone.utc)
    assert parse_iso("2030-01-01T10:00:00+02:00") == datetime(2030, 1, 1, 8, tzinfo=timezone.utc)
    assert format_span(3_723_000) == "1h 2m" and format_span(500) == "500ms" and format_span(86_400_000 * 3) == "3d"
    assert format_relative(now + 90_000, now) == "in 1m 30s" and format_relative(now - 5_000, now) == "5s ago"
    assert printable("a\x1b[2Jb\u202e\n") == "a\\x1b[2Jb\\u202e\\x0a"
    assert bar(0, 10) == "" and bar(10, 10) == "█" * 40 and bar(1, 1000) != ""


def test_a_time_written_to_the_millisecond_reads_back_as_that_millisecond():
    # The dashboard's confirm page carries its window as ISO times: read back, they must name the same instants.
    for ms in (1_795_556_627_807, 1_700_000_000_001, 0, MAX_DUE_MS):
        assert parse_when(iso_time(ms), 0) == ms
        assert due_to_ms(ms_to_datetime(ms)) == ms
    assert due_to_ms(datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc)) == parse_when("2030-01-01", 0) + 1


def test_payload_decoding_never_unpickles():
    pickled_body = base64.b64encode(b"\x80\x04\x95\x05\x00cos\nsystem\n").decode()
    message = {
        "body": pickled_body,
        "content-type": "application/x-python-serialize",
        "properties": {"body_encoding": "base64"},
    }
    decoded = decode_payload("celery", json.dumps(message).encode())
    assert decoded["body"]["format"] == "binary" and "not decoded" in decoded["body"]["note"]
    assert decode_payload("dramatiq", b"plain text")["format"] == "text"
    assert (
        decode_payload("celery", b'{"body": "not base64!", "properties": {"body_encoding": "base64"}}')["body"][
            "format"
        ]
        == "text"
    )
    text_body = decode_payload("celery", json.dumps({"body": "hi", "content-type": "text/plain"}).encode())
    assert text_body["body"] == {"content_type": "text/plain", "size": 2, "format": "text", "text": "hi"}


# -- cron ------------------------------------------------------------------------------------------------------------


def test_cron_ls_and_forget(run, store: DelayStore, client) -> None:
    from delay_broker.cron import CronScheduler, Schedule, occurrence_id

    assert "No recurring schedule" in run("cron", "ls").output
    build = lambda id, due: dramatiq_envelope("send_report", id)  # noqa: E731
    CronScheduler(store, [Schedule.create("daily-report", "0 9 * * *", build, "Europe/Paris")]).run_pending()
    client.hset(store.keys.cron, "spoiled", "garbage")
    listing = as_json(run("cron", "ls", "--json"))["schedules"]
    assert [row["name"] for row in listing] == ["daily-report", "spoiled"]
    report, spoiled = listing
    assert report["id"] == occurrence_id(store.keys.namespace, "daily-report", report["due_ms"])
    assert report["state"] == "parked" and report["due"].endswith(("T07:00:00.000Z", "T08:00:00.000Z"))
    assert (spoiled["due_ms"], spoiled["state"]) == (None, "malformed record")
    table = run("cron", "ls").output
    assert "daily-report" in table and "parked" in table and "malformed record" in table

    refused = run("cron", "forget", "daily-report")  # not a terminal, no --yes
    assert refused.exit_code == 1 and store.get(report["id"]) is not None
    forgotten = run("cron", "forget", "daily-report", "--yes")
    assert forgotten.exit_code == 0 and "cancelled its occurrence" in forgotten.output
    assert store.get(report["id"]) is None and set(store.schedules()) == {"spoiled"}
    assert as_json(run("cron", "forget", "spoiled", "--yes", "--json")) == {
        "name": "spoiled",
        "forgotten": True,
        "cancelled": False,
    }
    unknown = run("cron", "forget", "nothing", "--yes")
    assert unknown.exit_code == 1 and "no schedule 'nothing'" in unknown.output


def test_cron_add_change_pause_resume_run_now_and_remove(run, store: DelayStore) -> None:
    from delay_broker import RuntimeSchedules

    added = run(
        "cron",
        "add",
        "report",
        "--task",
        "send_report",
        "--cron",
        "0 9 * * 1-5",
        "--timezone",
        "Europe/Paris",
        "--args",
        '[42, "x"]',
        "--kwargs",
        '{"to": "ops"}',
        "--end",
        "2099-01-01",
    )
    assert added.exit_code == 0 and "Schedule 'report' added: cron 0 9 * * 1-5 (Europe/Paris)" in added.output
    stored = RuntimeSchedules(store).get("report")
    assert stored is not None and stored.call is not None and stored.call.args == (42, "x")
    assert stored.timing is not None and stored.timing.end_ms == 4_070_908_800_000

    listing = as_json(run("cron", "ls", "--json"))["schedules"]
    assert [(row["name"], row["source"], row["task"], row["paused"]) for row in listing] == [
        ("report", "stored", "send_report", False)
    ]
    assert "cron 0 9 * * 1-5" in run("cron", "ls").output

    assert as_json(run("cron", "pause", "report", "--json"))["paused"] is True
    assert "paused" in run("cron", "ls").output
    assert "resumed" in run("cron", "resume", "report").output
    changed = as_json(run("cron", "change", "report", "--every", "15m", "--start", "none", "--json"))
    assert changed["timing"].startswith("every 900 s")
    requested = as_json(run("cron", "run-now", "report", "--json"))
    assert requested["name"] == "report" and len(requested["id"]) == 36

    for args, problem in [
        (("cron", "add", "x", "--every", "1m"), "give --task"),
        (("cron", "add", "x", "--task", "t", "--every", "1m", "--args", "[oops"), "not JSON"),
        (("cron", "add", "x", "--task", "t", "--every", "soon"), "--every"),
        (("cron", "add", "x", "--task", "t"), "either cron= or every="),
        (("cron", "add", "report", "--task", "t", "--every", "1m"), "already stored"),
        (("cron", "change", "report"), "nothing to change"),
        (("cron", "pause", "missing"), "no schedule 'missing'"),
        (("cron", "remove", "missing", "--yes"), "no stored schedule 'missing'"),
    ]:
        result = run(*args)
        assert result.exit_code != 0 and problem in result.output, (args, result.output)

    assert run("cron", "remove", "report").exit_code == 1, "asks first; not a terminal"
    assert run("cron", "remove", "report", "--yes").exit_code == 0
    assert RuntimeSchedules(store).get("report") is None and store.stats().parked == 0


def test_ls_filters_and_bulk_cancel_reschedule_requeue_purge_by_filter(run, store: DelayStore) -> None:
    for n in range(12):
        queue, actor = ("emails", "send_welcome") if n % 3 else ("reports", "build_report")
        store.park(f"f-{n:02d}", dramatiq_envelope(actor, f"f-{n:02d}", queue=queue), delay=3600 + n)
    store.park("cel-acme", celery_envelope("tasks.bill", "cel-acme"), delay=7200)
    welcome = {f"f-{n:02d}" for n in range(12) if n % 3}

    listed, cursor = [], None
    while True:
        args = ["ls", "--task", "send_welcome", "--limit", "3", "--json"] + (["--cursor", cursor] if cursor else [])
        page = as_json(run(*args))
        listed += [message["id"] for message in page["messages"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert listed == sorted(welcome), "every match once, in due order, page by page"
    assert [m["id"] for m in as_json(run("ls", "--text", "[2, 3]", "--json"))["messages"]] == ["cel-acme"]
    assert "matching task 'send_welcome'" in run("ls", "--task", "send_welcome").output
    mixed = run("ls", "--task", "send_welcome", "--offset", "3")
    assert mixed.exit_code == 2 and "--cursor" in mixed.output

    refused = run("cancel", "--queue", "reports")
    assert refused.exit_code == 1 and "4 parked message(s) matching queue 'reports'" in refused.output
    cancelled = as_json(run("cancel", "--queue", "reports", "--yes", "--json"))
    assert (cancelled["matched"], cancelled["done"]) == (4, 4)
    assert all(store.get(f"f-{n:02d}") is None for n in range(0, 12, 3))
    assert run("cancel", "f-01", "--queue", "emails").exit_code == 2, "IDs or a filter, not both"

    moved = as_json(run("reschedule", "--task", "send_welcome", "--id-prefix", "f-0", "--now", "--yes", "--json"))
    assert moved["done"] == moved["matched"] == len([id for id in welcome if id.startswith("f-0")])
    info = store.get("f-01")
    assert info is not None and info.due_ms is not None and info.due_ms <= store.now_ms()
    assert store.get("f-10").due_ms > store.now_ms(), "outside the filter: not moved"  # type: ignore[union-attr]

    claim = store.claim(100, 60, "cli-test")
    store.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages])
    assert store.stats().dead == len(claim.messages) > 0
    requeued = as_json(run("dead", "requeue", "--task", "send_welcome", "--id-prefix", "f-01", "--yes", "--json"))
    assert (requeued["matched"], requeued["done"]) == (1, 1)
    purged = as_json(run("dead", "purge", "--queue", "emails", "--yes", "--json"))
    assert purged["done"] == purged["matched"] == len(claim.messages) - 1
    assert store.stats().dead == 0
    assert run("dead", "requeue", "f-02", "--all").exit_code == 2


def test_a_bulk_action_acts_on_the_messages_it_asked_about(run, store: DelayStore, monkeypatch) -> None:
    """Messages parked while the question waits for an answer are not among those the operator said yes to."""
    for n in range(5):
        store.park(f"old-{n}", dramatiq_envelope("newsletter", f"old-{n}", queue="emails"), delay=3600)
    asked: list[str] = []

    def answer_yes_meanwhile_three_more_are_parked(question: str, **options: Any) -> bool:
        asked.append(question)
        for n in range(3):
            store.park(f"new-{n}", dramatiq_envelope("newsletter", f"new-{n}", queue="emails"), delay=3600)
        return True

    monkeypatch.setattr(common, "interactive", lambda: True)
    monkeypatch.setattr(click, "confirm", answer_yes_meanwhile_three_more_are_parked)
    cancelled = run("cancel", "--queue", "emails")
    assert cancelled.exit_code == 0, cancelled.output
    assert asked == ["Cancel 5 parked message(s) matching queue 'emails'?"]
    assert "Cancel: 5 of 5 matching message(s)." in cancelled.output
    assert sorted(info.id for info in store.iter_all("due")) == ["new-0", "new-1", "new-2"]

    moved = as_json(run("reschedule", "--queue", "emails", "--now", "--yes", "--json"))
    assert (moved["matched"], moved["done"]) == (3, 3) and store.stats().overdue == 3


def test_a_bulk_move_goes_on_past_a_celery_payload_it_cannot_rewrite_and_says_so(run, store: DelayStore) -> None:
    """The others are moved; the unreadable one is named with why, left as it was, and the command exits 1."""
    for n in range(4):
        store.park(f"cel-{n}", celery_envelope("tasks.add", f"cel-{n}"), delay=3600)
    store.park("bad", Envelope("celery", b"\x80not json", framework="celery", name="tasks.add"), delay=3600)
    before = store.get("bad")
    result = run("reschedule", "--task", "tasks.add", "--now", "--yes")
    assert result.exit_code == 1
    assert "Run now: 4 of 5 matching message(s)." in result.output and "no longer there" not in result.output
    assert "could not be rewritten" in result.output and "'bad': UnicodeDecodeError" in result.output
    assert "Traceback" not in result.output
    assert store.stats().overdue == 4 and store.get("bad") == before
    moved = run("reschedule", "--task", "tasks.add", "--in", "1h", "--yes", "--json")
    report, _ = json.JSONDecoder().raw_decode(moved.stdout)
    assert moved.exit_code == 1 and (report["matched"], report["done"], report["skipped"]) == (5, 4, [])
    assert list(report["failed"]) == ["bad"] and "UnicodeDecodeError" in report["failed"]["bad"]
    single = run("reschedule", "bad", "--now")
    assert single.exit_code == 1 and "'bad' could not be rescheduled" in single.output
    assert "UnicodeDecodeError" in single.output and store.get("bad") == before


def test_a_store_with_its_own_key_prefix_is_read_with_prefix(run, redis_server, namespace) -> None:
    store = DelayStore(redis_server.client(), namespace=namespace, prefix="billing")
    store.park_many([ParkRequest(f"job-{n}", Envelope(route="q", payload=b"x"), delay=60) for n in range(5)])
    assert as_json(run("stats", "--json"))["parked"] == 0, "another prefix, another store"
    assert as_json(run("stats", "--prefix", "billing", "--json"))["parked"] == 5
    assert as_json(run("stats", "--json", env={"DELAY_BROKER_PREFIX": "billing"}))["parked"] == 5
    assert run("show", "job-1", "--prefix", "billing").exit_code == 0
    scrape = run("metrics", "--print", "--prefix", "billing", "-n", namespace)
    assert f'delay_broker_parked_messages{{namespace="{namespace}"}} 5.0' in scrape.output
