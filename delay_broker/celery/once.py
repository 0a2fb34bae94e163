"""Effectively-once execution for Celery (the ``once`` option): a promoted task delivered twice runs once.

See :mod:`delay_broker.once` for the records and the exact guarantee. With ``once: True`` the promoters mark each
task they republish (RabbitMQ, SQS, a Redis other than the store's) with the ``delay_broker_promotion`` header,
and :class:`OnceStep` makes the worker check marked tasks before their body runs.

Where the check sits. ``task_prerun`` cannot stop a task (Celery logs and ignores a receiver's exception), and the
worker's request class cannot be extended (the strategy derives its own class from it, overriding
``execute_using_pool`` and ``on_success`` without calling the base). The step therefore wraps each task's ``run``
in the worker before the tracers are built, so the check runs in the pool, where and when the body runs, like any
custom ``Task.__call__``: a duplicate raises :class:`~celery.exceptions.Ignore` (acknowledged, no result or
state written, no callbacks), anything else runs as before. Pool processes forked from the worker (prefork on
Linux) inherit the wrapped tasks; threads, solo, gevent and eventlet pools run in the worker itself.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import bootsteps
from celery.exceptions import Ignore, Reject

from ..once import PROMOTION_MARK, Executions
from .app import app_options, store_for, transport_kind
from .config import once_window

logger = logging.getLogger("delay_broker.celery")

_WRAPPED = "_delay_broker_once"


class OnceStep(bootsteps.Step):  # type: ignore[misc]
    """Wraps every task of the app so that a second delivery of a promoted task is dropped (``once: True``).

    A step of the worker blueprint: created before the pool's processes are forked and before the consumer
    builds the tasks' tracers, which take each task's ``run`` as it is then.
    """

    label = "delay_broker once"
    name = "delay_broker.celery.once.OnceStep"

    def include_if(self, parent: Any) -> bool:
        options = app_options(parent.app)
        return bool(options.enabled and options.once)

    def create(self, parent: Any) -> None:
        app = parent.app
        options = app_options(app)
        window = once_window(options, transport_kind(app)[0], app.conf.broker_transport_options)
        executions = Executions(store_for(app, options), window, metrics=options.metrics_port is not None)
        wrapped = install_once(app, executions)
        _warn_if_spawned(parent)
        _warn_if_tracked(app)
        logger.info(
            "delay_broker: effectively-once execution of promoted tasks (%d tasks, window %g s)", wrapped, window
        )


def install_once(app: Any, executions: Executions) -> int:
    """Wrap the ``run`` of every task of ``app`` (once each); returns how many were wrapped now."""
    count = 0
    for task in list(app.tasks.values()):
        if not getattr(task.run, _WRAPPED, False):
            task.run = _checked(task, task.run, executions)
            count += 1
    return count


def _checked(task: Any, run: Any, executions: Executions) -> Any:
    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> Any:
        request = task.request
        token = getattr(request, PROMOTION_MARK, None)
        if token is None or request.called_directly:
            return run(*args, **kwargs)  # not a task the store promoted: nothing to ask
        retries = request.retries or 0
        execution = executions.begin(request.id, token, retries if isinstance(retries, int) else -1)
        if not execution.runs:
            raise Ignore(f"a delivery of task {request.id} already ran")
        try:
            result = run(*args, **kwargs)
        except Ignore:
            executions.end(execution, succeeded=True)  # the task's own decision: done with this delivery
            raise
        except Reject as reject:
            # requeue=True: the broker hands this same delivery out again, which must then run.
            executions.end(execution, succeeded=not reject.requeue)
            raise
        except BaseException:
            executions.end(execution, succeeded=False)
            raise
        executions.end(execution, succeeded=True)
        return result

    setattr(checked, _WRAPPED, True)
    return checked


def _warn_if_tracked(app: Any) -> None:
    """``track_started`` stores STARTED before any hook that can stop a task runs: a dropped copy leaves it."""
    tracked = sorted(name for name, task in app.tasks.items() if getattr(task, "track_started", False))
    if tracked:
        logger.warning(
            "delay_broker once: %s track_started: Celery stores STARTED before the check runs, so a dropped second "
            "delivery leaves the task's state at STARTED in the result backend (its result is overwritten).",
            ", ".join(tracked[:10]) + (f" and {len(tracked) - 10} more" if len(tracked) > 10 else ""),
        )


def _warn_if_spawned(parent: Any) -> None:
    """A prefork pool whose processes are started afresh (spawn/forkserver) re-imports the tasks unwrapped."""
    if "prefork" not in str(getattr(parent, "pool_cls", "")):
        return
    import billiard  # type: ignore[import-untyped]

    method = billiard.get_start_method(allow_none=True)
    if method not in (None, "fork"):
        logger.warning(
            "delay_broker once: the prefork pool starts its processes with %r, so they import the tasks afresh and "
            "do not check promoted tasks (they run at least once). Use the fork start method, or the threads pool.",
            method,
        )
