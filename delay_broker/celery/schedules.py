"""Recurring Celery tasks without beat: every worker's promoter keeps the next occurrence parked.

Each occurrence's message is made by Celery itself (``app.send_task`` with ``eta=`` the occurrence), caught
by the delay_broker transport before it is sent (:func:`~delay_broker.celery.parking.capture_parked`), so
it carries exactly what a task sent by hand would: routing, headers, serializer, options (see
:mod:`delay_broker.celery.occurrences`, which the promoter uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any

from ..cron import Schedule
from ..errors import ConfigurationError
from ..schedule_defs import ScheduledCall
from ..schedules import RuntimeSchedules
from .app import store_for
from .occurrences import declare, occurrence_builder, schedules_of


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
    declare(app, created)
    return created


def runtime_schedules(app: Any) -> RuntimeSchedules:
    """Schedules managed at runtime (add, change, pause, resume, run now, remove) in the app's delay store; a
    call's ``task`` is a task name. Every worker's promoter runs them, as it runs declared ones."""
    return RuntimeSchedules(store_for(app), declared=lambda: schedules_of(app))


__all__ = ["occurrence_builder", "runtime_schedules", "schedule", "schedules_of"]
