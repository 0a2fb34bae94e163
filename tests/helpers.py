"""Shared test helpers."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from delay_broker import Envelope


def envelope(payload: bytes = b"job", route: str = "ready", **fields: object) -> Envelope:
    return Envelope(route=route, payload=payload, **fields)  # type: ignore[arg-type]


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.01
) -> Any:
    """Poll ``condition`` until it returns something true, and return that; AssertionError after ``timeout`` s.

    Test modules that poll something costly, or need longer, bind their own defaults with functools.partial.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(interval)


def dramatiq_envelope(actor: str, message_id: str, queue: str = "default") -> Envelope:
    """A Dramatiq message as the DelayMiddleware parks it: the JSON message, queue as route."""
    message = {
        "queue_name": queue,
        "actor_name": actor,
        "args": [42, "hello"],
        "kwargs": {"to": "ops@example.com"},
        "options": {"redis_message_id": f"rid-{message_id}"},
        "message_id": message_id,
        "message_timestamp": 1_700_000_000_000,
    }
    return Envelope(
        route=queue,
        payload=json.dumps(message).encode(),
        framework="dramatiq",
        name=actor,
        hash_field=f"rid-{message_id}",
    )


def celery_envelope(task: str, task_id: str, queue: str = "celery") -> Envelope:
    """A Celery task as the Redis transport publishes it (kombu's virtual message, base64 body)."""
    body = json.dumps([[2, 3], {"retry": True}, {"callbacks": None, "errbacks": None, "chain": None}])
    message = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": task, "id": task_id, "eta": "2030-01-01T00:00:00+00:00"},
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": "0d5c6d1e-tag",
        },
    }
    return Envelope(route=queue, payload=json.dumps(message).encode(), framework="celery", name=task)


def _fail_if_any(alive: list[str]) -> None:
    assert not alive, f"threads still running: {alive}"


@contextlib.contextmanager
def threads_running(
    targets: dict[str, Callable[[], None]],
    stop: threading.Event,
    timeout: float = 20.0,
    left_running: Callable[[list[str]], None] = _fail_if_any,
) -> Iterator[None]:
    """Run each target in a daemon thread named by its key; on the way out (normal or not) set ``stop``, join
    them, and hand the names of any still running to ``left_running`` (default: an AssertionError)."""
    threads = [threading.Thread(target=target, name=name, daemon=True) for name, target in targets.items()]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout)
        alive = [thread.name for thread in threads if thread.is_alive()]
        if alive:
            left_running(alive)


@contextlib.contextmanager
def running_worker(broker: Any, threads: int = 2) -> Iterator[Any]:
    """A real Dramatiq worker on ``broker`` (a StubBroker in these tests), stopped afterwards."""
    import dramatiq  # only the Dramatiq tests need it

    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=threads)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=5000)
