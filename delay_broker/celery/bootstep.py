"""The worker bootsteps of delay_broker: a promoter thread in every Celery worker, and its remote control for parked
tasks."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ..promoter import Promoter
from .app import app_options, build_promoter, store_for, transport_kind

logger = logging.getLogger("delay_broker.celery")


class PromoterStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Starts a promoter thread when the worker starts and stops it (after its batch) when it stops.

    A step of the *worker* blueprint, not the consumer's: consumer steps are restarted on every broker
    reconnect, and the promoter has its own reconnection and backoff. Disabled by the ``promoter: False``
    option (e.g. when promoters run as separate ``delay-broker promote`` processes).
    """

    label = "delay_broker promoter"
    name = "delay_broker.celery.bootstep.PromoterStep"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.promoter: Promoter | None = None
        self.metrics_server: Any = None

    def include_if(self, parent: Any) -> bool:
        options = app_options(parent.app)
        return options.enabled and options.promoter

    def create(self, parent: Any) -> None:
        return None

    def start(self, parent: Any) -> None:
        port = app_options(parent.app).metrics_port
        self.promoter = build_promoter(parent.app)
        if port is not None:
            # The ``metrics_port`` option: promoter counters and the store's backlog on one endpoint.
            from ..metrics import PromoterMetrics, start_metrics_server

            self.promoter.listener = PromoterMetrics.for_store(self.promoter.store)
            self.metrics_server = start_metrics_server(port, self.promoter.store)
            logger.info("delay_broker metrics on port %d", self.metrics_server.port)
        self.promoter.start()

    def stop(self, parent: Any) -> None:
        server, self.metrics_server = self.metrics_server, None
        if server is not None:
            server.stop()
        promoter, self.promoter = self.promoter, None
        if promoter is not None:
            promoter.stop()
            close = getattr(promoter.deliverer, "close", None)
            if close is not None:
                close()

    def terminate(self, parent: Any) -> None:
        self.stop(parent)


class ControlStep(bootsteps.Step):  # type: ignore[misc]
    """Makes the worker answer Celery's remote control for the app's parked tasks: ``inspect scheduled`` lists
    them (one worker per broadcast), and a ``revoke`` from any sender cancels them (see
    :mod:`delay_broker.celery.control`).

    A step of the worker blueprint, created before the worker's consumer (the blueprint's last step) and so before
    the consumer's mailbox, whose node must record the broadcasts it dispatches.
    """

    label = "delay_broker control"
    name = "delay_broker.celery.bootstep.ControlStep"

    def include_if(self, parent: Any) -> bool:
        return bool(app_options(parent.app).enabled)

    def create(self, parent: Any) -> None:
        from .control import install_control  # Celery's worker modules: loaded by workers only, not by producers

        app = parent.app
        options = app_options(app)
        kind, _ = transport_kind(app)
        install_control(app, store_for(app, options), options, options.threshold_for(kind))
