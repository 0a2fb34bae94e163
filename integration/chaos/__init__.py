"""Chaos at scale: millions of parked messages, real workers, hundreds of SIGKILLs, restarts and failovers.

    python -m integration.chaos --scale full     # 3,000,000 messages, 330 kills (86 min on 2 cores)
    python -m integration.chaos --scale tenth    # 300,000 messages, 60 kills (about 17 minutes)
    python -m integration.chaos --scale ci       # the same run, small (a few minutes; CI runs it)
    python -m integration.chaos --scale tenth --without-once   # the at-least-once targets run every delivery

Four targets, each a framework with its own workers (which host the promoters, as by default):

- ``dramatiq-redis``: Dramatiq RedisBroker, store in the broker's Redis (exactly-once hand-off);
- ``celery-redis``: Celery on our Redis transport, store in the broker's Redis (exactly-once hand-off);
- ``dramatiq-rabbitmq``: Dramatiq RabbitmqBroker, store on a Sentinel set with durable parks (at least once,
  executed effectively once by ``OnceMiddleware`` unless the run is ``--without-once``);
- ``dramatiq-sqs``: dramatiq-sqs on moto's SQS server, store on the same Sentinel set (likewise).

Producers send through the frameworks' own API (``broker.enqueue(message, delay=...)``, ``apply_async(countdown=
...)``); every message carries its id and due time, and the task body records when and where it ran in a Redis
of the run's own that nothing attacks. :mod:`.check` reads the records and the run's events (kills, restarts,
failovers) and says, per target, what was lost, duplicated (each duplicate by id, with its cause), early, and
how late.
"""
