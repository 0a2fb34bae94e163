"""Recurring Celery tasks without beat: every worker's promoter keeps the next occurrence parked.

Each occurrence's message is made by Celery itself (``app.send_task`` with ``eta=`` the occurrence), caught
by the delay_broker transport before it is sent (:func:`~delay_broker.celery.parking.capture_parked`), so
it carries exactly what a task sent by hand would: routing, headers, serializer, options.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from datetime import datetime, tzinfo
from typing import Any

from ..cron import Schedule
from ..envelope import Envelope
from ..errors import ConfigurationError, DelayBrokerError
from .parking import capture_parked

_registry: weakref.WeakKeyDictionary[Any, dict[str, Schedule]] = weakref.WeakKeyDictionary()


def schedule(
    app: Any,
    cron: str,
    task: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    timezone: str | tzinfo | None = None,
    **options: Any,
) -> Schedule:
    """Send ``task`` (a task or its name) at every occurrence of ``cron`` (``"0 9 * * 1-5"``; a sixth field is
    seconds) in ``timezone`` (default: the app's ``timezone`` setting, else UTC), each occurrence once, from
    the promoters of all workers at once: no beat process.

    Declare schedules in the module that defines the app or its tasks, so every worker imports them.
    ``name`` (default: the task name) identifies the schedule in Redis; ``options`` are ``apply_async``
    options (``queue``, ``priority``, ``expires``, ...). Needs the ``cron`` extra (croniter).
    """
    task_name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(task_name, str) or not task_name:
        raise ConfigurationError(f"task must be a Celery task or a task name, got {task!r}")
    for reserved in ("eta", "countdown", "task_id"):
        if reserved in options:
            raise ConfigurationError(f"{reserved!r} is set by the schedule for each occurrence")
    frozen_args, frozen_kwargs = tuple(args), dict(kwargs or {})

    def build(id: str, due: datetime) -> Envelope:
        with capture_parked() as captured:
            app.send_task(task_name, args=frozen_args, kwargs=frozen_kwargs, task_id=id, eta=due, **options)
        if len(captured) != 1:
            raise DelayBrokerError(
                f"the occurrence of {task_name!r} was not caught by a delay_broker transport: is it enabled?"
            )
        return captured[0]

    zone = timezone or app.conf.timezone or "UTC"
    created = Schedule.create(name or task_name, cron, build, zone)
    schedules = _registry.setdefault(app, {})
    if created.name in schedules:
        raise ConfigurationError(f"there is already a schedule named {created.name!r}: give this one a name")
    schedules[created.name] = created
    return created


def schedules_of(app: Any) -> dict[str, Schedule]:
    """The recurring schedules declared for ``app``, by name."""
    return dict(_registry.get(app, {}))
