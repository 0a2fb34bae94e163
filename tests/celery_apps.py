"""Celery apps for the adapter's fast tests: one per test, on the session's real redis-server, its keys under a
prefix of its own (removed afterwards, with its store's)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery import Celery

from delay_broker import DelayStore
from delay_broker.celery import install
from delay_broker.embedded import EmbeddedRedis


def make_app(server: EmbeddedRedis, unique: str, tz: str | None = None, **options: Any) -> Celery:
    """An app whose queue, key prefix and store namespace carry ``unique``, with one task, ``t.add``."""
    app = Celery(f"t{unique}", broker=server.url, set_as_current=False)
    app.conf.task_default_queue = f"q-{unique}"
    if tz:
        app.conf.timezone = tz
    app.conf.broker_transport_options = {"global_keyprefix": f"p{unique}:"}
    install(app, threshold=1.0, namespace=f"n-{unique}", **options)

    @app.task(name="t.add", shared=False)
    def add(x: int, y: int, **labels: str) -> int:
        return x + y

    return app


@contextlib.contextmanager
def celery_app(server: EmbeddedRedis, unique: str) -> Iterator[Celery]:
    """:func:`make_app`, closed afterwards and its keys removed (only its own: the server is shared)."""
    app = make_app(server, unique)
    try:
        yield app
    finally:
        client = server.client()
        keys = list(client.scan_iter(f"p{unique}:*")) + list(client.scan_iter(f"delay_broker:{{n-{unique}}}:*"))
        if keys:
            client.delete(*keys)
        app.close()


def store_of(app: Celery, server: EmbeddedRedis) -> DelayStore:
    """The store the app's transport options name, on ``server``."""
    return DelayStore(server.client(), namespace=app.conf.broker_transport_options["delay_broker"]["namespace"])
