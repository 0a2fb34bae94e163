"""Dramatiq adapter: long delays are parked in Redis and promoted into the broker's queue when due.

    >>> from delay_broker.dramatiq import DelayMiddleware
    >>> broker.add_middleware(DelayMiddleware(redis_url="redis://...", threshold=timedelta(minutes=15)))
    >>> send_reminder.send_with_options(args=(42,), delay=timedelta(days=30))   # parked, runs in 30 days

Works with RedisBroker (exactly-once hand-off into the broker's own lists), RabbitmqBroker,
``dramatiq_sqs.SQSBroker`` and StubBroker (at-least-once through the broker's ``enqueue``).
"""

from .delays import DEFAULT_THRESHOLD, SQS_MAX_DELAY_MS, delay_ms
from .delivery import BrokerDeliverer, RedisQueues
from .middleware import DelayMiddleware, build_promoter
from .once import OnceMiddleware

__all__ = [
    "DEFAULT_THRESHOLD",
    "SQS_MAX_DELAY_MS",
    "BrokerDeliverer",
    "DelayMiddleware",
    "OnceMiddleware",
    "RedisQueues",
    "build_promoter",
    "delay_ms",
]
