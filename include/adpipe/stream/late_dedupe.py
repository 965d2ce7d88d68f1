"""Which raw rows repeat an ``event_id`` the job has already seen: the state
behind "``ad-events-late`` lists each event once".

Spark's own dedupe (``dropDuplicatesWithinWatermark``) forgets an id once the
watermark passes the event, and drops late rows before it looks: on its own,
a late event re-sent in a later batch would be listed twice, and a late copy
of an event already counted on time would be listed as late. So a second
stateful operator (``transformWithStateInPandas``) sees every valid row, late
ones included, and remembers the ids per event-time minute:

- key: the minute of the row's event time; state: the sorted 128-bit BLAKE2b
  digests of the ids seen in that minute (one binary value, read and written
  whole, so a batch costs a few state calls per minute it touches, never one
  per row);
- a row repeats an id when its digest is in the state or an earlier row of
  the batch, in (partition, offset) order, has it; the operator emits the
  (partition, offset) of every repeating row and nothing else;
- retention: an event-time timer at the minute's end plus
  ``ADPIPE_LATE_DEDUPE_RETENTION_S`` clears the minute once the watermark
  passes it. After that, a copy of one of its events is no longer known: if
  it arrives it is late (its minute is far behind the watermark) and is
  listed again. The retention is in event time, not wall time, because the
  state is part of the checkpoint and a replayed batch must decide exactly as
  the first run did: the watermark of batch N is fixed in ``offsets/N``. (A
  processing-time TTL would also replay identically, but Spark then runs an
  empty micro-batch on every trigger for ever and an ``--available-now`` run
  never ends: measured on Spark 4.1.)

Copies of one ``event_id`` are expected to carry one event time; copies that
differ fall in different minutes and are not compared.

The same operator names the rows the batch must copy out, so that the job
never reads its input twice: every malformed row (they all come under one
key of their own, :data:`MALFORMED_KEY`, and leave no state), and every
valid row whose event time is at or before the watermark the operator runs
with (the current batch's, which is never behind the late-event watermark
Spark drops rows with: the driver keeps those at or before that one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

MINUTE_MS = 60_000
DIGEST_BYTES = 16
DIGEST_DTYPE = f"S{DIGEST_BYTES}"
# What the operator emits: a row per repeat, per malformed row and per
# possibly late row (a row can be both a repeat and possibly late).
REPEATS_SCHEMA = (
    "kind string, partition int, offset long, reject_reason string, event_id string, ad_id string, "
    "event_us long, watermark_ms long"
)
KIND_REPEAT = "repeat"
KIND_MALFORMED = "malformed"
KIND_MAYBE_LATE = "maybe_late"
# The key of malformed rows: no event minute is this far from 1970 (year 0001 is about -1e9).
MALFORMED_KEY = -(2**62)
_OUT_COLUMNS = ["kind", "partition", "offset", "reject_reason", "event_id", "ad_id", "event_us", "watermark_ms"]


def digests(event_ids: Sequence[str]) -> np.ndarray:
    """128-bit digests of the ids (fixed width: a digest that ends in zero
    bytes round-trips through ``tobytes``/``frombuffer`` unchanged)."""
    return np.array(
        [hashlib.blake2b(e.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest() for e in event_ids],
        dtype=DIGEST_DTYPE,
    )


def find_repeats(seen: np.ndarray, event_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For ids in arrival order: which repeat an id of ``seen`` (sorted
    digests) or of an earlier position, and the digests seen afterwards."""
    batch = digests(event_ids)
    if batch.size == 0:
        return np.zeros(0, dtype=bool), seen
    repeats = np.isin(batch, seen) | pd.Series(batch).duplicated().to_numpy()
    return repeats, np.union1d(seen, batch[~repeats]).astype(DIGEST_DTYPE)


class RepeatedEventIds(StatefulProcessor):
    """Keyed by event minute; input rows have ``event_id``, ``partition``,
    ``offset``; output rows are the (partition, offset) of the repeats."""

    def __init__(self, retention_ms: int) -> None:
        self.retention_ms = retention_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen_digests", "digests binary")

    def handleInputRows(  # noqa: N802 - Spark's name
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: ANN401, N803
    ) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True).sort_values(["partition", "offset"], kind="stable")
        watermark_ms = max(int(timerValues.getCurrentWatermarkInMs()), 0)
        if int(key[0]) == MALFORMED_KEY:
            yield _out(batch, KIND_MALFORMED, watermark_ms)
            return
        known = self.seen.exists()
        seen = np.frombuffer(self.seen.get()[0], dtype=DIGEST_DTYPE) if known else np.zeros(0, DIGEST_DTYPE)
        repeats, after = find_repeats(seen, batch["event_id"].tolist())
        if after.size != seen.size:
            self.seen.update((after.tobytes(),))
        if not known:
            self.handle.registerTimer((int(key[0]) + 1) * MINUTE_MS + self.retention_ms)
        maybe_late = (batch["event_us"] <= watermark_ms * 1000).to_numpy()
        yield pd.concat(
            [
                _out(batch.loc[repeats], KIND_REPEAT, watermark_ms),
                _out(batch.loc[maybe_late], KIND_MAYBE_LATE, watermark_ms),
            ],
            ignore_index=True,
        )

    def handleExpiredTimer(  # noqa: N802 - Spark's name
        self,
        key: Any,
        timerValues: Any,
        expiredTimerInfo: Any,  # noqa: ANN401, N803
    ) -> Iterator[pd.DataFrame]:
        self.seen.clear()
        return iter(())

    def close(self) -> None:
        pass


def _out(rows: pd.DataFrame, kind: str, watermark_ms: int) -> pd.DataFrame:
    """The output rows, as plain numpy and object columns (Arrow-backed
    input columns would reach Spark's serializer as chunked arrays)."""

    def objects(name: str) -> pd.Series:
        return pd.Series([None if pd.isna(v) else v for v in rows[name].tolist()], dtype=object)

    return pd.DataFrame(
        {
            "kind": pd.Series([kind] * len(rows), dtype=object),
            "partition": rows["partition"].to_numpy(dtype=np.int32),
            "offset": rows["offset"].to_numpy(dtype=np.int64),
            "reject_reason": objects("reject_reason"),
            "event_id": objects("event_id"),
            "ad_id": objects("ad_id"),
            "event_us": pd.Series([None if pd.isna(v) else int(v) for v in rows["event_us"].tolist()], dtype=object),
            "watermark_ms": np.full(len(rows), watermark_ms, dtype=np.int64),
        },
        columns=_OUT_COLUMNS,
    )
