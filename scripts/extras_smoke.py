"""One extra's smoke, run by scripts/extras in a fresh venv holding the built wheel with that extra alone; and
the check of what the built sdist and wheel hold.

    python extras_smoke.py EXTRA
    python extras_smoke.py --archives DIST_DIRECTORY

Each smoke does what a user of the extra does first, on a private redis-server (delay_broker.embedded, from the
wheel; the redis-server binary comes from the system): the README's Celery example parks a task and a promoter
hands it back, a Dramatiq send parks and a worker runs it, dramatiq-sqs parks a six-hour delay (on the moto
server scripts/extras starts), the command's help and stats, the dashboard's first page, a metrics scrape, a
trace context stored with a park, a cron occurrence parked. It fails with the reason on the first thing that
does not hold. Only the standard library and what the extra installs are imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import delay_broker
from delay_broker import DelayStore, Envelope
from delay_broker.embedded import EmbeddedRedis, free_port

NAMESPACE = "smoke"


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200, f"{url}: HTTP {response.status}"
        return str(response.read().decode())


def answers(url: str) -> str | None:
    try:
        return http_get(url)
    except OSError:
        return None


def readme_example(name: str, server: EmbeddedRedis) -> dict[str, Any]:
    """Runs the README's example between its ``--8<-- [start:NAME]`` and ``[end:NAME]`` markers (the docs site
    includes the same lines), on the private server instead of localhost:6379; returns its globals."""
    text = Path(os.environ["DELAY_BROKER_SMOKE_README"]).read_text()
    block = text.split(f"--8<-- [start:{name}] -->", 1)[1].split(f"--8<-- [end:{name}]", 1)[0]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    assert "redis://localhost:6379/0" in code, f"the README's {name} example names no local Redis"
    namespace: dict[str, Any] = {"__name__": f"readme_{name}"}
    exec(compile(code.replace("redis://localhost:6379/0", server.url), f"README.md ({name})", "exec"), namespace)
    return namespace


def celery(server: EmbeddedRedis) -> str:
    """The README's Celery example, as written, on the Redis transport; then promoted into the queue's list."""
    from celery import Celery

    import delay_broker.celery

    example = readme_example("celery", server)
    app, add = example["app"], example["add"]
    result = add.apply_async((2, 2), countdown=6 * 3600)  # parked in Redis; runs once, in 6 h
    info = delay_broker.celery.get(app, result.id)
    assert info is not None and info.state == "due", f"task {result.id} was not parked: {info}"
    assert server.client().llen("celery") == 0, "the task went to the queue instead of the store"
    delay_broker.celery.reschedule(app, result.id, countdown=0)
    promoter = delay_broker.celery.build_promoter(app, max_idle=0.2).start()
    try:
        wait_until(lambda: server.client().llen("celery") == 1, "the promoter to hand the task to its queue")
    finally:
        promoter.stop()
    # The RabbitMQ wrapper imports and validates with this extra alone (no broker needed to check options).
    amqp = Celery("proj", broker="amqp://guest:guest@127.0.0.1:5672//")
    amqp.conf.broker_transport = delay_broker.celery.TRANSPORT_AMQP
    amqp.conf.broker_transport_options = {"delay_broker": {"redis_url": server.url}}
    assert delay_broker.celery.validate(amqp).redis_url == server.url
    # Celery's CLI loads our subcommand through the celery.commands entry point on every start.
    celery_command = str(Path(sys.executable).with_name("celery"))
    help_text = subprocess.run([celery_command, "delay-broker", "--help"], capture_output=True, text=True, check=True)
    assert "promote" in help_text.stdout, help_text.stdout + help_text.stderr
    return f"task {result.id} parked, then promoted into the 'celery' list; celery delay-broker --help"


def dramatiq(server: EmbeddedRedis) -> str:
    """The README's Dramatiq example, as written: its 30-day send parks; moved to now, a real dramatiq Worker
    runs it once."""
    import dramatiq as dq
    from dramatiq.middleware import CurrentMessage

    from delay_broker.dramatiq import DelayMiddleware

    example = readme_example("dramatiq", server)
    broker = example["broker"]
    (delays,) = (middleware for middleware in broker.middleware if isinstance(middleware, DelayMiddleware))
    (parked,) = delays.store.list_messages("due")
    assert parked.envelope is not None and parked.envelope.name == "send_reminder", parked
    ran: list[str] = []

    def send_reminder(user_id: int) -> None:  # the example's actor, with a body that says which message ran
        assert user_id == 42
        ran.append(CurrentMessage.get_current_message().message_id)  # type: ignore[union-attr]

    broker.add_middleware(CurrentMessage())
    example["send_reminder"].fn = send_reminder
    assert delays.reschedule(parked.id, delay=0) is not None
    worker = dq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        wait_until(lambda: parked.id in ran, f"the parked message {parked.id} to run")
    finally:
        worker.stop()
        broker.close()
    assert delays.get(parked.id) is None and ran.count(parked.id) == 1
    return f"the README's example parked {parked.id} for 30 days; moved to now, it ran once in a Dramatiq worker"


def sqs(server: EmbeddedRedis) -> str:
    """dramatiq-sqs refuses delays over 15 minutes; with the middleware a six-hour delay is parked."""
    import dramatiq as dq
    import kombu.transport.SQS  # noqa: F401  (Celery on SQS: kombu[sqs] imports with this extra)
    from dramatiq_sqs import SQSBroker

    from delay_broker.dramatiq import DelayMiddleware

    endpoint = os.environ["DELAY_BROKER_SMOKE_SQS_ENDPOINT"]
    wait_until(lambda: answers(f"{endpoint}/moto-api/"), f"the moto server at {endpoint}")
    broker = SQSBroker(namespace=f"smoke{uuid.uuid4().hex[:8]}_", endpoint_url=endpoint, region_name="us-east-1")
    delays = DelayMiddleware(redis_url=server.url, namespace=NAMESPACE)
    broker.add_middleware(delays)
    dq.set_broker(broker)

    @dq.actor(queue_name="smoke")
    def remind(user_id: int) -> None: ...

    message = remind.send_with_options(args=(42,), delay=timedelta(hours=6))
    info = delays.get(message)
    assert info is not None and info.state == "due", f"message {message.message_id} was not parked: {info}"
    native = remind.send_with_options(args=(42,), delay=timedelta(minutes=10))  # under SQS's 900 s: SQS keeps it
    assert delays.get(native) is None, "a delay SQS takes itself was parked"
    return f"message {message.message_id} parked for 6 h (over SQS's 15 minutes) on moto; 10 minutes went to SQS"


def cli(server: EmbeddedRedis) -> str:
    """``delay-broker --help``, and stats and ls of a namespace holding one parked message."""
    command = str(Path(sys.executable).with_name("delay-broker"))
    help_text = subprocess.run([command, "--help"], capture_output=True, text=True, check=True).stdout
    assert "delay-broker stats" in help_text and "Commands:" in help_text, help_text
    store = DelayStore(server.client(), namespace=NAMESPACE)
    store.park("cli-smoke", Envelope(route="default", payload=b"{}", framework="dramatiq", name="remind"), delay=60)
    env = {**os.environ, "DELAY_BROKER_REDIS_URL": server.url, "DELAY_BROKER_NAMESPACE": NAMESPACE}
    stats = subprocess.run([command, "stats", "--json"], capture_output=True, text=True, env=env, check=True)
    assert json.loads(stats.stdout)["parked"] == 1, stats.stdout
    listing = subprocess.run([command, "ls"], capture_output=True, text=True, env=env, check=True).stdout
    assert "cli-smoke" in listing, listing
    return "delay-broker --help, stats --json and ls on a parked message"


def web(server: EmbeddedRedis) -> str:
    """``delay-broker web`` serves the overview page of a namespace (and the ASGI/WSGI apps import)."""
    from delay_broker.web import create_app, wsgi_app

    store = DelayStore(server.client(), namespace=NAMESPACE)
    assert create_app(store) is not None and wsgi_app(store) is not None
    store.park("web-smoke", Envelope(route="default", payload=b"{}", framework="dramatiq", name="remind"), delay=60)
    port = free_port()
    command = [str(Path(sys.executable).with_name("delay-broker")), "web", "-r", server.url, "-n", NAMESPACE]
    process = subprocess.Popen([*command, "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        page = wait_until(lambda: answers(f"http://127.0.0.1:{port}/"), "the dashboard to answer", timeout=20)
        listing = http_get(f"http://127.0.0.1:{port}/messages")
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0].decode(errors="replace")
    assert NAMESPACE in page and "parked" in page.lower(), page[:2000]
    assert "web-smoke" in listing, f"the message list does not show the parked message: {listing[:2000]} {output}"
    return f"delay-broker web answered / and /messages on port {port}"


def prometheus(server: EmbeddedRedis) -> str:
    """A scrape shows the store's backlog, and a promoter's counters after it promoted a due message."""
    from prometheus_client import CollectorRegistry

    from delay_broker import ListTarget, Promoter
    from delay_broker.deliverers import DirectLists
    from delay_broker.metrics import PromoterMetrics, start_metrics_server

    store = DelayStore(server.client(), namespace=NAMESPACE)
    registry = CollectorRegistry()
    store.park("due-now", Envelope(route="ready", payload=b"x"), delay=0)
    store.park("later", Envelope(route="ready", payload=b"x"), delay=3600)
    listener = PromoterMetrics.for_store(store, registry)
    promoter = Promoter(store, DirectLists({"ready": ListTarget("smoke:ready")}), listener=listener, max_idle=0.2)
    promoter.start()
    try:
        wait_until(lambda: server.client().llen("smoke:ready") == 1, "the due message to be promoted")
    finally:
        promoter.stop()
    with start_metrics_server(0, store, registry, addr="127.0.0.1") as metrics:
        text = http_get(metrics.url)
    for line in (
        f'delay_broker_parked_messages{{namespace="{NAMESPACE}"}} 1.0',
        f'delay_broker_promoted_total{{namespace="{NAMESPACE}"}} 1.0',
    ):
        assert line in text, f"{line!r} not in the scrape:\n{text}"
    return "a scrape of /metrics: 1 parked, 1 promoted"


def otel(server: EmbeddedRedis) -> str:
    """With the API alone (no SDK), a park inside a span stores that span's trace context with the message."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id = uuid.uuid4().int >> 1, uuid.uuid4().int >> 65
    producer = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1)))
    store = DelayStore(server.client(), namespace=NAMESPACE)
    with trace.use_span(producer):
        store.park("traced", Envelope(route="ready", payload=b"x"), delay=3600)
    info = store.get("traced")
    assert info is not None and info.envelope is not None
    carrier = info.envelope.extra.get("otel", {})
    assert f"{trace_id:032x}" in carrier.get("traceparent", ""), f"no trace context stored: {info.envelope.extra}"
    return f"traceparent {carrier['traceparent']} stored with the parked message"


def cron(server: EmbeddedRedis) -> str:
    """A cron schedule (croniter) parks its next occurrence: the next whole minute."""
    from delay_broker.cron import CronScheduler, Schedule

    store = DelayStore(server.client(), namespace=NAMESPACE)

    def build(id: str, due: datetime) -> Envelope:
        return Envelope(route="ready", payload=json.dumps({"id": id, "due": due.isoformat()}).encode())

    scheduler = CronScheduler(store, [Schedule.create("every-minute", "* * * * *", build)])
    assert scheduler.run_pending() == 1, "no occurrence was parked"
    stats = store.stats()
    assert stats.parked == 1 and stats.next_due_ms is not None
    due = datetime.fromtimestamp(stats.next_due_ms / 1000, timezone.utc)
    assert (
        due.second == 0
        and due.microsecond == 0
        and timedelta(0) < due - datetime.now(timezone.utc) <= timedelta(seconds=61)
    ), f"the occurrence is due at {due}"
    return f"the next occurrence of '* * * * *' parked, due {due:%H:%M:%S}Z"


SMOKES: dict[str, Callable[[EmbeddedRedis], str]] = {
    "celery": celery,
    "dramatiq": dramatiq,
    "sqs": sqs,
    "cli": cli,
    "web": web,
    "prometheus": prometheus,
    "otel": otel,
    "cron": cron,
}


def check_archives(dist: Path) -> None:
    """The sdist builds the package and nothing else (no tests: they need the repository's servers); the wheel
    holds the code with its Lua, SQL, templates and py.typed; both carry the licence and the metadata."""
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        pkg_info = archive.extractfile(f"{archive.getnames()[0].split('/')[0]}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    for name in ("LICENSE", "README.md", "pyproject.toml", "delay_broker/scripts/park.lua", "delay_broker/py.typed"):
        assert name in names, f"{sdist.name} lacks {name}"
    strays = sorted(name for name in names if name.startswith(("tests/", "integration/", "benchmarks/", "docs/")))
    assert not strays, f"{sdist.name} holds {strays[:5]}"
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = set(archive.namelist())
        (metadata_name,) = (name for name in wheel_names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    wanted = ["delay_broker/py.typed", "delay_broker/scripts/park.lua", "delay_broker/web/templates/base.html"]
    wanted.append(metadata_name.replace("METADATA", "licenses/LICENSE"))
    for name in wanted:
        assert name in wheel_names, f"{wheel.name} lacks {name}"
    assert any(name.startswith("delay_broker/celery/") and name.endswith(".lua") for name in wheel_names)
    assert any(name.startswith("delay_broker/far/") and name.endswith(".sql") for name in wheel_names)
    assert not [name for name in wheel_names if not name.startswith(("delay_broker/", "delay_broker-"))]
    for text in (pkg_info, metadata):
        assert "License-Expression: MIT" in text and "License-File: LICENSE" in text
        assert "Requires-Python: >=3.10" in text
        for version in ("3.10", "3.11", "3.12", "3.13"):
            assert f"Programming Language :: Python :: {version}" in text
        for extra in SMOKES:
            assert f"Provides-Extra: {extra}" in text
    print(
        f"extras: {sdist.name} ({len(names)} files, {sdist.stat().st_size // 1024} KiB, no tests) and "
        f"{wheel.name} ({len(wheel_names)} files, {wheel.stat().st_size // 1024} KiB) hold the LICENSE and metadata"
    )


def main() -> None:
    if sys.argv[1] == "--archives":
        check_archives(Path(sys.argv[2]))
        return
    extra = sys.argv[1]
    installed = Path(delay_broker.__file__).resolve()
    if Path(sys.prefix).resolve() not in installed.parents:
        sys.exit(f"extras: delay_broker imported from {installed}, not from the venv's wheel at {sys.prefix}")
    started = time.monotonic()
    with EmbeddedRedis() as server:
        what = SMOKES[extra](server)
    print(f"extras: [{extra}] ok in {time.monotonic() - started:.1f} s: {what}")


if __name__ == "__main__":
    main()
