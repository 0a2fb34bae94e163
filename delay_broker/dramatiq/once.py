"""OnceMiddleware: a promoted message delivered twice (at-least-once promotion) runs once (opt-in).

See :mod:`delay_broker.once` for the records and the exact guarantee. This module is Dramatiq's side: the
promoters of a broker with an :class:`OnceMiddleware` mark each message they promote through the broker's
``enqueue`` with the ``delay_broker_promotion`` option, and the middleware checks marked messages in workers.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import dramatiq
from dramatiq.middleware import SkipMessage

from ..errors import ConfigurationError
from ..once import DEFAULT_WINDOW, PROMOTION_MARK, Execution, Executions, check_window
from ..store import DelayStore


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
        timeout). Default one hour (see :data:`delay_broker.once.DEFAULT_WINDOW`).
      store: the store whose Redis keeps the records; default: the broker's ``DelayMiddleware``'s.
      metrics: count the drops in ``delay_broker_duplicates_dropped_total``; default: when the broker has
        Dramatiq's ``Prometheus`` middleware.
    """

    def __init__(
        self,
        *,
        window: float | timedelta = DEFAULT_WINDOW,
        store: DelayStore | None = None,
        metrics: bool | None = None,
    ) -> None:
        self.window = check_window(window.total_seconds() if isinstance(window, timedelta) else window)
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
                    self._executions = Executions(self._store or _delay_store(broker), self.window, metrics=metrics)
        return self._executions

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


def marks_promotions(broker: dramatiq.Broker) -> bool:
    """Whether the promoters of ``broker`` mark the messages they promote (it has an :class:`OnceMiddleware`)."""
    return any(isinstance(middleware, OnceMiddleware) for middleware in broker.middleware)


def _delay_store(broker: dramatiq.Broker) -> DelayStore:
    from .middleware import DelayMiddleware

    for middleware in broker.middleware:
        if isinstance(middleware, DelayMiddleware):
            return middleware.store
    raise ConfigurationError("OnceMiddleware needs a DelayMiddleware on the broker, or store=")
