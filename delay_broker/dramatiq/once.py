"""OnceMiddleware: a promoted message delivered twice (at-least-once promotion) runs once (opt-in).

See :mod:`delay_broker.once` for the records and the exact guarantee. This module is Dramatiq's side: the
promoters of a broker with an :class:`OnceMiddleware` mark each message they promote through the broker's
``enqueue`` with the ``delay_broker_promotion`` option, and the middleware checks marked messages in workers.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, ClassVar

import dramatiq
from dramatiq.middleware import SkipMessage

from ..errors import ConfigurationError
from ..once import PROMOTION_MARK, Execution, Executions, check_window, default_window, window_too_short
from ..store import DelayStore
from .delays import native_cap_ms
from .middleware import DelayMiddleware

logger = logging.getLogger("delay_broker.dramatiq")


class OnceMiddleware(dramatiq.Middleware):
    """Drops a second delivery of a message the delay store promoted, once the first ran to its end.

    Add it after :class:`~delay_broker.dramatiq.DelayMiddleware`, in workers and in standalone promoters (they
    mark what they promote only when the broker has one). Messages the store did not promote, and those the
    exactly-once RedisBroker path promotes, are not checked. A dropped delivery is acknowledged without running
    (Dramatiq logs "Message ... was skipped."), counted in the store's ``duplicates_dropped`` counter and logged
    once per id at INFO.

    Examples:
      >>> broker.add_middleware(DelayMiddleware(redis_url="redis://cache:6379/0"))
      >>> broker.add_middleware(OnceMiddleware())

    Parameters:
      window: seconds (or a timedelta) an execution is remembered: longer than the promoters' ``lease`` and
        than the broker's redelivery of a message whose worker died (RabbitMQ: at once; SQS: its visibility
        timeout). Default: one hour, or the lease plus dramatiq-sqs's ``visibility_timeout`` plus a minute when
        that is longer (see :func:`delay_broker.once.default_window`).
      store: the store whose Redis keeps the records; default: the broker's ``DelayMiddleware``'s.
      metrics: count the drops in ``delay_broker_duplicates_dropped_total``; default: when the broker has
        Dramatiq's ``Prometheus`` middleware.
    """

    marks_promotions: ClassVar[bool] = True
    """Read by the broker's deliverer (:mod:`.delivery`): promoters mark what they promote."""

    def __init__(
        self,
        *,
        window: float | timedelta | None = None,
        store: DelayStore | None = None,
        metrics: bool | None = None,
    ) -> None:
        seconds = window.total_seconds() if isinstance(window, timedelta) else window
        self.window = None if seconds is None else check_window(seconds)
        """The window given, or None for the default (known once the broker is)."""
        self._store = store
        self.metrics = metrics
        self._executions: Executions | None = None
        self._lock = threading.Lock()
        self._current = threading.local()

    def executions(self, broker: dramatiq.Broker) -> Executions:
        """The records of this broker's executions (made at the first promoted message a worker runs)."""
        if self._executions is None:
            with self._lock:
                if self._executions is None:
                    metrics = self.metrics
                    if metrics is None:
                        metrics = any(type(m).__name__ == "Prometheus" for m in broker.middleware)
                    window = self.window or default_window(*_waits(broker))
                    self._executions = Executions(self._store or _delay_store(broker), window, metrics=metrics)
        return self._executions

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Say once, when a worker starts, if a window given cannot cover the promoters' lease or the broker's
        redelivery (dramatiq-sqs's ``visibility_timeout``, 12 hours by default)."""
        problem = None if self.window is None else window_too_short(self.window, *_waits(broker))
        if problem:
            logger.warning("OnceMiddleware: %s.", problem)

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        self._current.execution = None
        token = message.options.get(PROMOTION_MARK)
        if token is None or message.failed:
            return
        retries = message.options.get("retries", 0)
        attempt = retries if isinstance(retries, int) and not isinstance(retries, bool) else -1
        execution = self.executions(broker).begin(message.message_id, token, attempt)
        if not execution.runs:
            raise SkipMessage(f"a delivery of message {message.message_id} already ran")
        self._current.execution = execution

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end(broker, message, succeeded=exception is None)

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        # Skipped by a middleware after this one let it run: it did not run, so a later copy may.
        self._end(broker, message, succeeded=False)

    def _end(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy, *, succeeded: bool) -> None:
        execution: Execution | None = getattr(self._current, "execution", None)
        if execution is None or execution.id != message.message_id:
            return
        self._current.execution = None
        self.executions(broker).end(execution, succeeded=succeeded)


def _waits(broker: dramatiq.Broker) -> tuple[float, float | None]:
    """The promoters' lease, and how long the broker waits before it hands out again a message whose worker
    died: dramatiq-sqs's visibility timeout (RabbitMQ and RedisBroker: at once, or once the worker's heartbeat
    has stopped)."""
    leases = [m.promoter_options["lease"] for m in broker.middleware if isinstance(m, DelayMiddleware)]
    visibility = getattr(broker, "visibility_timeout", None) if native_cap_ms(broker) is not None else None
    return float(max(leases, default=0.0)), None if visibility is None else float(visibility)


def _delay_store(broker: dramatiq.Broker) -> DelayStore:
    for middleware in broker.middleware:
        if isinstance(middleware, DelayMiddleware):
            return middleware.store
    raise ConfigurationError("OnceMiddleware needs a DelayMiddleware on the broker, or store=")
