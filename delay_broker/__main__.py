"""``python -m delay_broker`` is the ``delay-broker`` command."""

from .cli import main

main()
