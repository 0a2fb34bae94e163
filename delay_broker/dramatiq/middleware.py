"""DelayMiddleware: long Dramatiq delays are parked in a Redis delay store instead of a worker's memory."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, tzinfo
from types import FrameType
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import q_name
from dramatiq.errors import QueueNotFound

from ..clock import delay_to_ms, ms_to_datetime
from ..cron import Build, CronScheduler, Schedule
from ..envelope import Envelope
from ..errors import ConfigurationError, DelayBrokerError, InvalidDelay, StoreUnavailable
from ..keys import DEFAULT_NAMESPACE
from ..operations import MessageFilter, Operations
from ..promoter import Deliverer, DirectDeliverer, Promoter
from ..schedule_defs import ScheduledCall
from ..schedules import RuntimeSchedules
from ..store import DelayStore, MessageInfo
from .delays import (
    DEFAULT_THRESHOLD,
    check_consumer_timeout,
    delay_ms,
    effective_threshold_ms,
    native_cap_ms,
    refuse_what_sqs_would,
    threshold_ms,
)
from .delivery import FRAMEWORK, BrokerDeliverer, Enqueue, RedisQueues, canonical_queues
from .received import park_on_receipt, parked_on_receipt

logger = logging.getLogger("delay_broker.dramatiq")

AnyMessage = dramatiq.Message[Any]


class DelayMiddleware(dramatiq.Middleware):
    """Parks messages delayed longer than ``threshold`` in a Redis delay store and promotes them when due.

    Dramatiq has no hook that can stop an enqueue, so the middleware wraps the ``enqueue`` method of the
    broker instance it is added to. It does so as soon as the broker has a queue (when it is added to a broker
    with actors, or when the first actor is declared), which covers producer-only processes such as web apps.
    A promoter thread runs in every worker process unless ``promote_in_workers=False``.

    Examples:
      >>> broker.add_middleware(DelayMiddleware(threshold=timedelta(minutes=15)))  # RedisBroker
      >>> broker.add_middleware(DelayMiddleware(redis_url="redis://cache:6379/0"))  # any broker

    Parameters:
      redis_url: the Redis that holds the delay store.
      client: a redis-py client (bytes replies) for it, instead of ``redis_url``. With neither, a RedisBroker's
        own client is used; other brokers need one of the two.
      threshold: seconds (or a timedelta). Messages delayed by strictly more are parked; shorter and
        ``delay=None`` ones take the broker's own path untouched. Default: the broker's native limit where
        it has one (SQS: 900 s), otherwise 60 s. It is never raised above that native limit. ``0`` parks
        every delayed message except ``delay=0``.
      namespace: the delay store namespace; applications sharing one Redis use different namespaces.
      direct: promote with the exactly-once script into the RedisBroker's own lists. Default: when the
        broker is a RedisBroker and the store uses its client. Pass True if ``redis_url`` names the same
        Redis server (and database) as the broker.
      promote_in_workers: run a promoter thread in every worker process.
      batch: messages a promoter claims or moves at once (see :class:`~delay_broker.promoter.Promoter`).
      lease: seconds an at-least-once promoter holds the messages it claimed before another may take them.
      max_idle: longest sleep in seconds between two looks at the store when nothing is due sooner.
      store_options: more :class:`~delay_broker.store.DelayStore` arguments (``max_attempts``,
        ``retry_backoff``, ``max_payload_bytes``, ``prefix``, ``max_delay``, ``dead_max_count``,
        ``dead_max_age``, ...).
      metrics: count each worker promoter's work in Prometheus metrics
        (:class:`~delay_broker.metrics.PromoterMetrics`). Default: when the broker has Dramatiq's
        ``Prometheus`` middleware, whose endpoint then shows them next to the ``dramatiq_*`` metrics.
      consumer_timeout: RabbitmqBroker only: the server's ``consumer_timeout`` in seconds (or a timedelta),
        ``False`` if it is turned off; default: RabbitMQ's 30 minutes. A threshold at or above it is
        logged as a warning when the middleware is installed (see :func:`.delays.check_consumer_timeout`).
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        client: redis.Redis | None = None,
        threshold: float | timedelta | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        direct: bool | None = None,
        promote_in_workers: bool = True,
        batch: int = 200,
        lease: float = 30.0,
        max_idle: float = 5.0,
        store_options: dict[str, Any] | None = None,
        metrics: bool | None = None,
        consumer_timeout: float | timedelta | bool | None = None,
    ) -> None:
        if redis_url is not None and client is not None:
            raise ConfigurationError("give redis_url or client, not both")
        if not 1 <= batch <= 1000 or lease <= 0 or max_idle <= 0:
            raise ConfigurationError("batch must be 1..1000, lease and max_idle positive")
        self.threshold_ms = None if threshold is None else threshold_ms(threshold)
        self.consumer_timeout_ms = _consumer_timeout_ms(consumer_timeout)
        self.namespace = namespace
        self.direct = direct
        self.promote_in_workers = promote_in_workers
        self.metrics = metrics
        self.promoter_options: dict[str, Any] = {"batch": batch, "lease": lease, "max_idle": max_idle}
        self._store_options = dict(store_options or {})
        self._own_store = redis_url is not None or client is not None
        self._store: DelayStore | None = None
        if redis_url is not None:
            self._store = DelayStore.from_url(redis_url, namespace=namespace, **self._store_options)
        elif client is not None:
            self._store = DelayStore(client, namespace=namespace, **self._store_options)
        self.broker: dramatiq.Broker | None = None
        self._original_enqueue: Enqueue | None = None
        self._original_flush: Callable[[str], None] | None = None
        self._original_flush_all: Callable[[], None] | None = None
        self._flushing_all = threading.local()
        self._effective_threshold_ms: int | None = None
        self._on_redis = self._on_sqs = False
        self._promoters: dict[int, Promoter] = {}
        self._schedules: dict[str, Schedule] = {}
        self._lock = threading.Lock()

    # -- installation ----------------------------------------------------------------------------------

    def install(self, broker: dramatiq.Broker) -> None:
        """Wrap ``broker.enqueue``. Called from the declaration hooks; call it yourself only for a broker
        that sends messages to queues it never declared."""
        with self._lock:
            if self.broker is broker:
                return
            if self.broker is not None:
                raise ConfigurationError("a DelayMiddleware serves one broker: add a new one to each broker")
            if self.direct and not isinstance(broker, RedisBroker):
                raise ConfigurationError("direct=True needs a RedisBroker")
            if isinstance(getattr(broker.enqueue, "__self__", None), DelayMiddleware):
                raise ConfigurationError("this broker already has a DelayMiddleware")
            self._effective_threshold_ms = effective_threshold_ms(broker, self.threshold_ms)
            if self.threshold_ms is not None and self.threshold_ms > self._effective_threshold_ms:
                logger.warning(
                    "threshold lowered to the broker's native limit of %d ms: longer delays would be refused",
                    self._effective_threshold_ms,
                )
            check_consumer_timeout(broker, self._effective_threshold_ms, self.consumer_timeout_ms)
            if getattr(broker, "confirm_delivery", None) is False:
                logger.warning(
                    "RabbitmqBroker without confirm_delivery=True: a message promoted while the connection is "
                    "failing can be acknowledged in the delay store without reaching RabbitMQ"
                )
            self._on_redis = isinstance(broker, RedisBroker)
            self._on_sqs = native_cap_ms(broker) is not None
            self._original_enqueue = broker.enqueue
            broker.enqueue = self._enqueue  # type: ignore[method-assign]
            self._original_flush, self._original_flush_all = broker.flush, broker.flush_all
            broker.flush = self._flush  # type: ignore[method-assign]
            broker.flush_all = self._flush_all  # type: ignore[method-assign]
            self.broker = broker

    def after_declare_queue(self, broker: dramatiq.Broker, queue_name: str) -> None:
        self.install(broker)

    def before_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        self.install(broker)

    # -- properties ------------------------------------------------------------------------------------

    @property
    def store(self) -> DelayStore:
        """The delay store, for inspection (``stats()``, ``list_messages()``, dead letters)."""
        if self._store is None:
            if isinstance(self.broker, RedisBroker):
                self._store = DelayStore(self.broker.client, namespace=self.namespace, **self._store_options)
            else:
                raise ConfigurationError(
                    "DelayMiddleware needs redis_url= or client= unless it is added to a RedisBroker"
                    + ("" if self.broker is not None else " (it is not installed on a broker yet)")
                )
        return self._store

    @property
    def threshold(self) -> timedelta:
        """The threshold in force (after the broker's native limit is applied)."""
        millis = self._effective_threshold_ms
        if millis is None:  # not installed yet: the broker's limit is not known
            return DEFAULT_THRESHOLD if self.threshold_ms is None else timedelta(milliseconds=self.threshold_ms)
        return timedelta(milliseconds=millis)

    @property
    def is_direct(self) -> bool:
        """Whether due messages are moved into the RedisBroker's lists by the exactly-once script."""
        if self.direct is not None:
            return self.direct
        return isinstance(self.broker, RedisBroker) and not self._own_store

    # -- sending ---------------------------------------------------------------------------------------

    def _enqueue(self, message: AnyMessage, *, delay: Any = None) -> AnyMessage:
        assert self._original_enqueue is not None and self._effective_threshold_ms is not None
        if parked_on_receipt(message, delay):
            return message  # a worker's consumer handing back a message it parked on receipt: it is in the store
        if delay is None:
            return self._original_enqueue(message, delay=None)
        try:
            millis = delay_ms(delay)
        except InvalidDelay as error:
            if not _swallowed_by_dramatiq(message):
                raise  # the caller sees it and decides
            # Retry(delay=-500) from a "retry at T" that just passed: plain Dramatiq runs it now.
            logger.error("Invalid delay %r for %s (%s): handed to the broker as it is.", delay, message, error)
            return self._original_enqueue(message, delay=_native_form(delay))
        if millis <= self._effective_threshold_ms:
            # Normalized: SQS needs an int, and a timedelta from Retry(delay=...) would break eta arithmetic.
            return self._original_enqueue(message, delay=millis)
        return self.park(message, millis)

    def park(self, message: AnyMessage, delay: int) -> AnyMessage:
        """Park ``message`` (a Message or the MessageProxy Retries passes) for ``delay`` milliseconds.

        The stored message is the one to enqueue when due: canonical queue, no ``eta``, and on a RedisBroker
        a fresh ``redis_message_id``. Returns it, as ``broker.enqueue`` returns what it enqueued.
        """
        plain: AnyMessage = getattr(message, "_message", message)  # unwrap a MessageProxy
        try:
            parked, envelope = self._envelope(plain)
            self.store.park(parked.message_id, envelope, delay=timedelta(milliseconds=delay))
        except (QueueNotFound, DelayBrokerError) as error:
            if not _swallowed_by_dramatiq(message):
                raise  # the caller sees it and decides
            # Any store failure (down, read-only replica, out of memory, no permission, payload too large), or a
            # queue only another service declares (Redis and RabbitMQ brokers take it natively): an exception
            # from a retry or a pipeline's next stage is swallowed by Dramatiq, the message lost.
            if isinstance(error, StoreUnavailable) and not self.store.withdraw(parked.message_id, envelope.payload):
                return parked  # already being promoted: the store delivers it (only the park raises this)
            return self._fall_back(message, delay, error)
        logger.debug("Parked message %s for %r for %d ms.", parked.message_id, parked.queue_name, delay)
        return parked

    def _envelope(self, message: AnyMessage) -> tuple[AnyMessage, Envelope]:
        """The message as it is to be enqueued when due (canonical queue, no ``eta``, on a RedisBroker a
        fresh ``redis_message_id``) and its envelope."""
        broker = self._installed()
        queue_name = q_name(message.queue_name)
        if queue_name not in broker.get_declared_queues() and queue_name not in canonical_queues(broker):
            raise QueueNotFound(f"cannot park a message for undeclared queue {queue_name!r}")  # type: ignore[no-untyped-call]
        options = {key: value for key, value in message.options.items() if key != "eta"}
        if self._on_redis:
            # Always, even when promotion is not direct: any promoter may then take the exactly-once path.
            options["redis_message_id"] = str(uuid.uuid4())
        parked = dataclasses.replace(message, queue_name=queue_name, options=options)
        payload = parked.encode()
        if self._on_sqs:
            refuse_what_sqs_would(broker, payload, queue_name)
        envelope = Envelope(
            route=queue_name,
            payload=payload,
            framework=FRAMEWORK,
            name=parked.actor_name,
            hash_field=options.get("redis_message_id"),
        )
        return parked, envelope

    def _fall_back(self, message: AnyMessage, delay: int, error: Exception) -> AnyMessage:
        # A retry or a pipeline's next stage from inside a worker: an exception here is swallowed by Dramatiq
        # and the message acked, i.e. lost. Better a message held natively (or sooner, at the broker's limit)
        # than none.
        assert self._original_enqueue is not None and self.broker is not None
        cap = native_cap_ms(self.broker)
        native = delay if cap is None else min(delay, cap)
        logger.error(
            "Delay store refused a message sent from a worker's middleware (%s); %s handed to the broker, "
            "delayed %d ms.",
            error,
            message,
            native,
        )
        return self._original_enqueue(message, delay=native)

    def _flush(self, queue_name: str) -> None:
        """``broker.flush``: the queue's messages, and those parked for it, which are its delayed messages to
        the application. Test suites flush between tests; a parked message left behind would run in a later
        one."""
        assert self._original_flush is not None
        self._original_flush(queue_name)
        if not getattr(self._flushing_all, "active", False):
            self._cancel_parked_for({q_name(queue_name)})

    def _flush_all(self) -> None:
        """``broker.flush_all``: every declared queue, then what is parked for them, each queue scanned once
        (the broker's own ``flush_all`` flushes delay queues by name too)."""
        assert self._original_flush_all is not None and self.broker is not None
        self._flushing_all.active = True
        try:
            self._original_flush_all()
        finally:
            self._flushing_all.active = False
        self._cancel_parked_for(canonical_queues(self.broker))

    def _cancel_parked_for(self, queues: set[str]) -> None:
        # A flush must not fail on the store: without one nothing was parked, and with Redis down the
        # broker's queues are flushed all the same and the parked messages are said to stay.
        try:
            operations = Operations(self.store)
        except ConfigurationError:
            return
        for queue in sorted(queues):
            try:
                operations.cancel(filter=MessageFilter(queue=queue))
            except DelayBrokerError as error:
                logger.warning("Flushing %r: the messages parked for it stay parked (%s).", queue, error)

    # -- managing parked messages ----------------------------------------------------------------------

    def cancel(self, message: str | AnyMessage) -> bool:
        """Cancel a parked message (by id or message). False if it is not parked (any more)."""
        return self.store.cancel(_id_of(message))

    def reschedule(
        self, message: str | AnyMessage, delay: int | timedelta | None = None, *, due: datetime | None = None
    ) -> datetime | None:
        """Move a parked message to a new time: ``delay`` in milliseconds from now as in Dramatiq (or a
        timedelta; ``0`` runs it now) or an aware ``due`` datetime. Returns the new due time, or None when
        the message is not parked (unknown, being promoted, or already promoted)."""
        if (delay is None) == (due is None):
            raise InvalidDelay("give exactly one of delay and due")
        if delay is not None:
            due_ms = self.store.reschedule(_id_of(message), delay=timedelta(milliseconds=delay_ms(delay)))
        else:
            due_ms = self.store.reschedule(_id_of(message), due=due)
        return None if due_ms is None else ms_to_datetime(due_ms)

    def get(self, message: str | AnyMessage) -> MessageInfo | None:
        """What the store holds for a message: state, due time, attempts, last error."""
        return self.store.get(_id_of(message))

    def parked_message(self, message: str | AnyMessage) -> AnyMessage | None:
        """The parked Dramatiq message itself (decoded with the current encoder), or None."""
        info = self.get(message)
        envelope = info.envelope if info else None
        return None if envelope is None else dramatiq.Message.decode(envelope.payload)

    # -- recurring schedules ---------------------------------------------------------------------------

    def schedule(
        self,
        actor: dramatiq.Actor[Any, Any],
        cron: str | None = None,
        *,
        every: float | timedelta | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        timezone: str | tzinfo = "UTC",
        **options: Any,
    ) -> Schedule:
        """Send ``actor`` a message at every occurrence of ``cron`` (``"0 9 * * 1-5"``; a sixth field is
        seconds) in ``timezone``, or ``every`` seconds (a number or timedelta, counted from ``start``, else from
        the epoch), between ``start`` and ``end`` if given, from every worker's promoter at once, each
        occurrence once.

        Declare schedules where the actors are declared, so that every worker (and ``delay-broker promote
        --dramatiq``) knows them. ``name`` (default: the actor's name) identifies the schedule in Redis;
        ``options`` are message options, as for ``send_with_options``. Each occurrence is parked one period
        ahead, so ``delay-broker ls`` shows it; occurrences missed while no promoter ran are skipped.
        :attr:`runtime_schedules` pauses, resumes, re-times or runs it now without a deploy. Cron needs the
        ``cron`` extra (croniter).
        """
        build = self._occurrence_builder(lambda: actor, tuple(args), dict(kwargs or {}), options)
        schedule = Schedule.create(name or actor.actor_name, cron, build, timezone, every=every, start=start, end=end)
        if schedule.name in self._schedules:
            raise ConfigurationError(f"there is already a schedule named {schedule.name!r}: give this one a name")
        # Fail here, at declaration, rather than in a worker at the first occurrence.
        actor.message_with_options(args=tuple(args), kwargs=dict(kwargs or {}), **options).encode()
        self._schedules[schedule.name] = schedule
        return schedule

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The recurring schedules declared with :meth:`schedule`, by name."""
        return dict(self._schedules)

    @property
    def runtime_schedules(self) -> RuntimeSchedules:
        """Schedules managed at runtime (add, change, pause, resume, run now, remove) in this store; a call's
        ``task`` is an actor name of this broker. Every promoter of the namespace runs them."""
        return RuntimeSchedules(self.store, check=self._check_call, declared=lambda: self._schedules)

    def _check_call(self, call: ScheduledCall) -> None:
        actor = self._actor(call.task)
        actor.message_with_options(args=call.args, kwargs=dict(call.kwargs), **call.options).encode()

    def _actor(self, name: str) -> dramatiq.Actor[Any, Any]:
        try:
            return self._installed().get_actor(name)
        except dramatiq.errors.ActorNotFound:
            raise ConfigurationError(f"no actor named {name!r} is declared on this broker") from None

    def _stored_build(self, call: ScheduledCall) -> Build:
        """How the promoters make the message of a stored schedule: the actor is looked up at each occurrence,
        so a schedule stored before its actor was deployed runs once it is."""
        return self._occurrence_builder(lambda: self._actor(call.task), call.args, dict(call.kwargs), call.options)

    def _occurrence_builder(
        self,
        actor_of: Callable[[], dramatiq.Actor[Any, Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Mapping[str, Any],
    ) -> Build:
        def build(id: str, due: datetime) -> Envelope:
            message = actor_of().message_with_options(args=args, kwargs=kwargs, **options)
            # Created at its due time, not when parked a period ahead: AgeLimit (max_age) counts from it.
            created = int(due.timestamp() * 1000)
            return self._envelope(dataclasses.replace(message, message_id=id, message_timestamp=created))[1]

        return build

    # -- receiving -------------------------------------------------------------------------------------

    def before_delay_message(self, broker: dramatiq.Broker, message: dramatiq.MessageProxy) -> None:
        """A worker received a message with an eta (sent without delay_broker, or before it was turned on): one
        due later than the threshold is parked and acknowledged instead of held in the worker's memory (see
        :mod:`.received`)."""
        if self.broker is not broker or self._effective_threshold_ms is None:
            return
        park_on_receipt(self.store, self._effective_threshold_ms, self._envelope, message)

    # -- promotion -------------------------------------------------------------------------------------

    def deliverer(self) -> Deliverer | DirectDeliverer:
        broker = self._installed()
        if self.is_direct:
            return RedisQueues(broker)
        assert self._original_enqueue is not None
        return BrokerDeliverer(broker, self._original_enqueue)

    def build_promoter(self, **overrides: Any) -> Promoter:
        """A promoter for this broker; ``overrides`` replace ``batch``, ``lease``, ``max_idle`` and so on."""
        # Always a scheduler: schedules stored at runtime reach promoters that declare none in code.
        cron = CronScheduler(self.store, self._schedules.values(), builder=self._stored_build)
        return Promoter(self.store, self.deliverer(), cron=cron, **{**self.promoter_options, **overrides})

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if not self.promote_in_workers:
            return
        self.install(broker)
        promoter = self.build_promoter()
        if self._wants_metrics(broker):
            from ..metrics import PromoterMetrics

            # Made after Dramatiq's Prometheus middleware booted the process, so in its multiprocess mode.
            promoter.listener = PromoterMetrics.for_store(self.store)
        self._promoters[id(worker)] = promoter.start()

    def _wants_metrics(self, broker: dramatiq.Broker) -> bool:
        if self.metrics is not None:
            return self.metrics
        return any(type(middleware).__name__ == "Prometheus" for middleware in broker.middleware)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        promoter = self._promoters.pop(id(worker), None)
        if promoter is not None:
            # Finishes the batch in hand; anything claimed but not delivered goes back to the store.
            promoter.stop()

    def _installed(self) -> dramatiq.Broker:
        if self.broker is None:
            raise ConfigurationError("DelayMiddleware is not installed: add it with broker.add_middleware()")
        return self.broker


def _consumer_timeout_ms(value: float | timedelta | bool | None) -> int | bool | None:
    """The ``consumer_timeout`` option: None (RabbitMQ's default), False (turned off) or positive milliseconds."""
    if value is None or value is False:
        return value
    try:
        millis = None if value is True else delay_to_ms(value)
    except InvalidDelay:
        millis = None
    if not millis:
        raise ConfigurationError(
            f"consumer_timeout must be positive seconds, a timedelta, False (turned off) or None, got {value!r}"
        )
    return millis


_DRAMATIQ_HOOKS = frozenset({dramatiq.Broker.emit_before.__code__, dramatiq.Broker.emit_after.__code__})


def _swallowed_by_dramatiq(message: AnyMessage) -> bool:
    """Whether an error raised now would be swallowed by Dramatiq, losing the message: it is a retry
    (``Retries`` passes a MessageProxy) or is sent from inside any middleware's hook (a pipeline's next stage,
    a group's completion callback), which Dramatiq runs with every exception logged and dropped. Looked up only
    when something failed: the stack is walked for the broker's hook dispatchers."""
    if isinstance(message, dramatiq.MessageProxy):
        return True
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code in _DRAMATIQ_HOOKS:
            return True
        frame = frame.f_back
    return False


def _native_form(delay: Any) -> Any:
    """A delay the store refused, as the broker gets it: a negative one is due now (what plain Dramatiq makes of
    it on RedisBroker; SQS refuses a negative DelaySeconds); anything else is passed on as it came."""
    if isinstance(delay, timedelta) and delay < timedelta(0):
        return 0
    if isinstance(delay, int | float) and not isinstance(delay, bool) and delay < 0:
        return 0
    return delay


def _id_of(message: str | AnyMessage) -> str:
    return message if isinstance(message, str) else message.message_id


def build_promoter(broker: dramatiq.Broker, **overrides: Any) -> Promoter:
    """A standalone promoter for ``broker``, configured by the broker's :class:`DelayMiddleware`.

    This is what ``delay-broker promote --dramatiq package.module:broker`` runs.
    """
    for middleware in broker.middleware:
        if isinstance(middleware, DelayMiddleware):
            middleware.install(broker)
            return middleware.build_promoter(**overrides)
    raise ConfigurationError("the broker has no DelayMiddleware: add one with broker.add_middleware()")
