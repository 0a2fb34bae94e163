"""Recurring Celery tasks without beat: every worker's promoter keeps the next occurrence parked.

Each occurrence's message is made by Celery itself (``app.send_task`` with ``eta=`` the occurrence), caught
by the delay_broker transport before it is sent (:func:`~delay_broker.celery.parking.capture_parked`), so
it carries exactly what a task sent by hand would: routing, headers, serializer, options.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from ..cron import Build, Schedule
from ..envelope import Envelope
from ..errors import ConfigurationError, DelayBrokerError
from ..schedule_defs import ScheduledCall
from ..schedules import RuntimeSchedules
from .parking import capture_parked

_registry: weakref.WeakKeyDictionary[Any, dict[str, Schedule]] = weakref.WeakKeyDictionary()


def schedule(
    app: Any,
    cron: str | None = None,
    task: Any = None,
    *,
    every: float | timedelta | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    timezone: str | tzinfo | None = None,
    **options: Any,
) -> Schedule:
    """Send ``task`` (a task or its name) at every occurrence of ``cron`` (``"0 9 * * 1-5"``; a sixth field is
    seconds) in ``timezone`` (default: the app's ``timezone`` setting, else UTC), or ``every`` seconds (a
    number or timedelta, counted from ``start``, else from the epoch), between ``start`` and ``end`` if given,
    each occurrence once, from the promoters of all workers at once: no beat process.

    Declare schedules in the module that defines the app or its tasks, so every worker imports them.
    ``name`` (default: the task name) identifies the schedule in Redis; ``options`` are ``apply_async``
    options (``queue``, ``priority``, ``expires``, ...). :func:`runtime_schedules` pauses, resumes, re-times or
    runs it now without a deploy. Cron needs the ``cron`` extra (croniter).
    """
    task_name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(task_name, str) or not task_name:
        raise ConfigurationError(f"task must be a Celery task or a task name, got {task!r}")
    for reserved in ("eta", "countdown", "task_id"):
        if reserved in options:
            raise ConfigurationError(f"{reserved!r} is set by the schedule for each occurrence")
    build = occurrence_builder(app, ScheduledCall(task_name, tuple(args), dict(kwargs or {}), options))
    zone = timezone or app.conf.timezone or "UTC"
    created = Schedule.create(name or task_name, cron, build, zone, every=every, start=start, end=end)
    schedules = _registry.setdefault(app, {})
    if created.name in schedules:
        raise ConfigurationError(f"there is already a schedule named {created.name!r}: give this one a name")
    schedules[created.name] = created
    return created


def occurrence_builder(app: Any, call: ScheduledCall) -> Build:
    """Makes each occurrence's message with Celery itself (``send_task`` with the occurrence's id and eta)."""

    def build(id: str, due: datetime) -> Envelope:
        options = dict(call.options)
        expires = _expires_at(app, call, due)
        if expires is not None:
            options["expires"] = expires
        with capture_parked() as captured:
            app.send_task(call.task, args=call.args, kwargs=dict(call.kwargs), task_id=id, eta=due, **options)
        if len(captured) != 1:
            raise DelayBrokerError(
                f"the occurrence of {call.task!r} was not caught by a delay_broker transport: is it enabled?"
            )
        return captured[0]

    return build


def _expires_at(app: Any, call: ScheduledCall, due: datetime) -> datetime | None:
    """A relative ``expires`` (seconds or a timedelta, the call's or else its task's) as the time it ends,
    counted from the occurrence: Celery counts it from the send, which for an occurrence is its build, a period
    ahead, so every occurrence would expire before it is due (beat sends at the due time)."""
    expires = (
        call.options["expires"] if "expires" in call.options else getattr(app.tasks.get(call.task), "expires", None)
    )
    if isinstance(expires, timedelta):
        return due + expires
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        return due + timedelta(seconds=expires)
    return None  # none, or already a point in time


def schedules_of(app: Any) -> dict[str, Schedule]:
    """The recurring schedules declared for ``app``, by name."""
    return dict(_registry.get(app, {}))


def runtime_schedules(app: Any) -> RuntimeSchedules:
    """Schedules managed at runtime (add, change, pause, resume, run now, remove) in the app's delay store; a
    call's ``task`` is a task name. Every worker's promoter runs them, as it runs declared ones."""
    from .api import store_for

    return RuntimeSchedules(store_for(app), declared=lambda: schedules_of(app))
