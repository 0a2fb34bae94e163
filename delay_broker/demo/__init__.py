"""The ``delay-broker demo``: a Dramatiq app on a private Redis, run with and without delay_broker side by
side (:mod:`.dramatiq_run`), and a framework-free variant on plain Redis lists (:mod:`.lists`)."""
