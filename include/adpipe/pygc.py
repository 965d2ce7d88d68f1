"""Python's garbage collector in adpipe's long-running batch loops (the
budget service, the stream driver): set up once, before the first batch.

Each batch allocates tens of thousands of short-lived objects (messages,
parsed records, row dicts): with Python's default thresholds a young
collection runs every 700 allocations and now and then a full one walks
every object the process holds (its imported modules, SQLAlchemy's
metadata, the Spark session's py4j objects). The objects made during the
start-up are frozen (never scanned again) and young collections run every
YOUNG_THRESHOLD allocations: the budget service's batches took about a fifth
less time (``make bench-stages ARGS="--budget-batch-sizes 2000 --events
500000 --ads 10000"``). Garbage is still collected; cycles only later."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune_for_batches() -> None:
    """Freeze what the process holds now, and collect the young less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
