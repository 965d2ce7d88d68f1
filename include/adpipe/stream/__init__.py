"""The aggregation stream job: raw events in, minute aggregates out, one
Kafka transaction per micro-batch.

* :mod:`~adpipe.stream.job` - the Spark Structured Streaming query, late-event
  routing, the heartbeat, ``run``.
* :mod:`~adpipe.stream.sink` - the transactional sink: outputs and input
  offsets in one transaction, fencing, replay detection; its parts
  :mod:`~adpipe.stream.sink_clients` (the producer, fencing, closing) and
  :mod:`~adpipe.stream.sink_ledger` (the ledger, recovery at start).
* :mod:`~adpipe.stream.offset_log` - what Spark's checkpoint says a batch was.
* :mod:`~adpipe.stream.transforms` - pure DataFrame steps (windows, late rows).
* :mod:`~adpipe.stream.cli` - ``adpipe stream``.

May import: the shared modules of ``adpipe`` (settings, schemas, raw_events,
kafka_io, spark, faults); no other part."""
