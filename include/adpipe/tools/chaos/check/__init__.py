"""The independent check and the report of ``adpipe chaos``.

Nothing here uses the stream job's, the loader's or the budget service's
code: the truth is the producer's own record of what it sent (its plan
summary) and the raw topic as the broker holds it; the output is read back
with plain Kafka consumers and SQL, and the arithmetic is plain Python.

On-time and late output are judged apart, so that a loss in one cannot be
made up by a surplus in the other (:func:`check_stream_output`):

- every late listing must be justified: its window's allowed lateness had
  passed by the watermark its batch ran with (the ``adpipe.watermark_ms``
  header), and that watermark is no higher than the raw records allow (the
  largest valid event time read before the batch, less the watermark delay;
  the batch boundaries come from the ledger's commits, sampled during the run);
- an event is never counted and listed: a listing of an event one of whose
  copies was read while its window was certainly open is a double;
- per (ad, minute, type) the aggregates (each window's latest revision)
  count exactly the events sent less the justified listings; a lost and a
  doubled event cannot cancel, since each listing is judged on its own
  before the counts are compared; a revision that adds no event is a failure.

A malformed message must be in the DLQ once; the spend of each ad must be
the sum of its aggregates' charges to the micro-unit.

The modules: ``events`` (the producer's truth, the verdict's tally, the
check by sums), ``raw`` (the raw topic, the ledger's boundaries, the late
listings, the watermark bounds), ``stream`` (the verdict on the stream's
output), ``tables`` (the Delta tables read with delta-rs), ``spend`` (the
budgets), ``summary`` (the faults per kind, the run's verdict, its table)."""

from __future__ import annotations

from .events import Key, Truth, Verdict, check_events
from .raw import (
    EVENT_TYPES,
    MAX_FIELD_CHARS,
    MINUTE_MS,
    LateListing,
    LedgerBoundary,
    RawEvent,
    RawRecord,
    RawTopic,
    StreamRules,
    WatermarkBounds,
    ledger_boundary,
    minute_label,
    parse_event,
)
from .spend import charge_micros, check_spend
from .stream import check_stream_output
from .summary import percentile, render_table, run_verdict, summarize_failover, summarize_faults
from .tables import DELTA_TABLES, compare_tables, read_delta_tables

__all__ = [
    "DELTA_TABLES",
    "EVENT_TYPES",
    "MAX_FIELD_CHARS",
    "MINUTE_MS",
    "Key",
    "LateListing",
    "LedgerBoundary",
    "RawEvent",
    "RawRecord",
    "RawTopic",
    "StreamRules",
    "Truth",
    "Verdict",
    "WatermarkBounds",
    "charge_micros",
    "check_events",
    "check_spend",
    "check_stream_output",
    "compare_tables",
    "ledger_boundary",
    "minute_label",
    "parse_event",
    "percentile",
    "read_delta_tables",
    "render_table",
    "run_verdict",
    "summarize_failover",
    "summarize_faults",
]
