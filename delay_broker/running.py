"""Running a long-lived process from a command line: the application it names, its logging, its stop signals.

Click-free, so that both commands use it: ``delay-broker promote`` (:mod:`delay_broker.cli`) and the Celery
adapter's ``celery delay-broker promote``, which must not load click's and rich's command modules to start.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .stop_flag import StopFlag

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def import_object(path: str) -> Any:
    """Import ``package.module:attribute`` (or ``package.module.attribute``).

    Raises ValueError, saying why, when ``path`` is malformed, its module cannot be imported or it has no such
    attribute: the command line named something that is not there (a usage error).
    """
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"expected MODULE:NAME (e.g. myapp.tasks:broker), got {path!r}")
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import {module_name!r}: {error}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{module_name!r} has no attribute {attribute!r}") from None


def configure_logging(level: str | int = "INFO") -> None:
    """Log to stderr (if the application has not set logging up) and put the ``delay_broker`` logger at
    ``level``: promoter start/stop, Redis lost/regained and dead letters are INFO and WARNING lines."""
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(level=numeric, format=LOG_FORMAT)
    logging.getLogger("delay_broker").setLevel(numeric)


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on SIGINT or SIGTERM while inside; the previous handlers are put back after."""
    previous = {signum: signal.signal(signum, lambda *_: callback()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stopped = StopFlag()
    with on_stop_signals(stopped.set):
        while not stopped.wait(1.0):
            pass


def run_until_signalled(promoter: Any, *, log_level: str | int | None = "INFO") -> None:
    """Run a promoter until SIGINT or SIGTERM, which stop it after the batch in hand.

    ``log_level=None`` leaves logging as the caller set it up.
    """
    if log_level is not None:
        configure_logging(log_level)
    signalled = StopFlag()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            promoter.run()
        except BaseException as error:  # raised again below, as if run() had been called here
            failed.append(error)

    # The promoter in a thread of its own, so that this one, out of the signal handler, can stop it with stop():
    # that also wakes a promoter asleep in a BLPOP of up to max_idle, which no handler may do (the handler would
    # share the client's connection pool, and its lock, with the code it interrupted).
    thread = threading.Thread(target=run, name=f"delay-broker-promoter-{promoter.id}", daemon=True)
    with on_stop_signals(signalled.set):
        thread.start()
        try:
            while thread.is_alive() and not signalled.wait(1.0):
                pass
        finally:
            try:
                promoter.stop(timeout=None)
            finally:
                thread.join()
    if failed:
        raise failed[0]


__all__ = ["configure_logging", "import_object", "on_stop_signals", "run_until_signalled", "wait_for_signal"]
