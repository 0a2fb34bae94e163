"""A test hook for ``delay-broker import`` run as a subprocess: each batch it parks waits before it leaves the broker.

The integration tests' app modules call :func:`install` when ``DB_SLOW_IMPORT`` / ``DBT_SLOW_IMPORT`` is set, so
that a SIGKILL sent while the import runs lands between a park and the removal from the broker more often than not.
"""

from __future__ import annotations

import time
from typing import Any


def install(seconds: float) -> None:
    from delay_broker.importing.runner import Importer

    park_each = Importer._park_each

    def slowly(self: Importer, items: Any) -> Any:
        results = park_each(self, items)
        time.sleep(seconds)
        return results

    Importer._park_each = slowly  # type: ignore[method-assign]
