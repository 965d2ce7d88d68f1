"""The sink's ledger metadata, and how a load reads its output offsets back."""

from __future__ import annotations

import json

from adpipe import kafka_io
from adpipe.stream.sink_ledger import MAX_LEDGER_METADATA_BYTES, ledger_metadata


def test_the_ledger_names_each_output_partitions_end_and_the_load_reads_it_back() -> None:
    outputs = {("ad-aggregates", 0): 120, ("ad-aggregates", 3): 7, ("ad-events-late", 1): 2}
    meta = ledger_metadata(9, "q-1", 1_795_348_800_000, outputs)
    assert json.loads(meta) == {
        "batch_id": 9, "query_id": "q-1", "watermark_ms": 1_795_348_800_000,
        "out": {"ad-aggregates": {"0": 120, "3": 7}, "ad-events-late": {"1": 2}},
    }
    older = ledger_metadata(8, "q-1", 0, {("ad-aggregates", 0): 100})
    # Every input partition carries its batch's entry; the last batch's counts.
    commits = {0: (50, meta), 1: (40, older), 2: (-1, "")}
    assert kafka_io.committed_outputs(commits) == {"ad-aggregates": {0: 120, 3: 7}, "ad-events-late": {1: 2}}
    assert kafka_io.committed_outputs({0: (5, json.dumps({"batch_id": 1, "watermark_ms": 0}))}) == {}
    assert kafka_io.committed_outputs({}) == {}


def test_output_offsets_too_many_for_the_metadata_are_left_out() -> None:
    outputs = {(f"topic-with-a-long-name-{t}", p): 10**9 for t in range(3) for p in range(64)}
    meta = ledger_metadata(1, "q", 0, outputs)
    assert json.loads(meta) == {"batch_id": 1, "query_id": "q", "watermark_ms": 0}
    assert len(ledger_metadata(1, "q", 0, dict(list(outputs.items())[:20])).encode()) <= MAX_LEDGER_METADATA_BYTES
    assert "out" in json.loads(ledger_metadata(1, "q", 0, dict(list(outputs.items())[:20])))
