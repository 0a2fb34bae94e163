"""How long to wait after failures in a row: exponential, capped, with equal jitter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

_MAX_DOUBLINGS = 64  # far past any cap, and far from a float's overflow


@dataclass(frozen=True)
class Backoff:
    """The backoff after ``failures`` failures in a row (a value: :meth:`failed` and :meth:`reset` return new ones).

    The n-th failure in a row has a ceiling of ``first * 2 ** (n - 1)`` seconds, at most ``cap``; the wait is
    drawn between half the ceiling and all of it (*equal* jitter). The fixed half keeps a failure from being
    retried at once; the random half keeps promoters that failed together from retrying in step against a
    server that is coming back.

    Parameters:
      first: the ceiling after the first failure, in seconds.
      cap: the largest ceiling, in seconds.
      failures: failures in a row so far (0: no wait).
    """

    first: float = 0.1
    cap: float = 10.0
    failures: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap or self.failures < 0:
            raise ValueError(f"a backoff needs 0 < first <= cap and failures >= 0, not {self!r}")

    def failed(self) -> Backoff:
        """The backoff after one more failure."""
        return replace(self, failures=self.failures + 1)

    def reset(self) -> Backoff:
        """The backoff after a success."""
        return replace(self, failures=0) if self.failures else self

    @property
    def ceiling(self) -> float:
        """The longest wait now, in seconds (0 before any failure)."""
        if not self.failures:
            return 0.0
        return min(self.cap, math.ldexp(self.first, min(self.failures - 1, _MAX_DOUBLINGS)))

    def wait(self) -> float:
        """A wait drawn with equal jitter, in seconds: between half the :attr:`ceiling` and all of it."""
        ceiling = self.ceiling
        return random.uniform(ceiling / 2, ceiling)
