"""The stream job's one stateful operator: per event-time minute, the
distinct events it counted, its open window's counts, and which rows are
late, repeated or malformed.

Why one operator in Python rather than Spark's ``dropDuplicatesWithinWatermark``
and window aggregation: those drop late rows silently (we must list them in
``ad-events-late``, once), and a second operator beside them made every
micro-batch read and parse its input twice. This operator sees every row
once (``transformWithStateInPandas``, keyed by the row's event minute and
a bucket of its ``event_id``: copies of an id share a key, and a minute's
rows spread over :data:`ID_BUCKETS` keys, which Spark's tasks run in
parallel; each key emits its part of a window's counts, and the driver adds
the parts up):

- state per minute: the sorted 128-bit BLAKE2b digests of the ``event_id``\\ s
  seen in it (one binary value, read and written whole: a few state calls
  per minute a batch touches, never one per row), and while its window is
  open the per-ad counts (one Arrow IPC value);
- a row *repeats* when its digest is in the state or an earlier row of the
  batch, in (partition, offset) order, has it: it is not counted again;
- a row is *late* when its window had closed before the batch: the window's
  end is at or before the watermark the batch runs with (Spark's, from the
  largest event time of the batches before it less the allowed lateness; it
  is fixed in ``offsets/N``, so a replay decides exactly as the first run).
  A late row that is not a repeat is listed (``late``); a late repeat is
  only named (``repeat``);
- a window is emitted once, by an event-time timer at its end: in the first
  batch whose watermark reaches it (after that batch's rows are counted);
- retention: a second timer at the minute's end plus
  ``ADPIPE_LATE_DEDUPE_RETENTION_S`` clears the minute. After that a copy of
  one of its events is no longer known: it is late (its minute is far behind
  the watermark) and is listed again. The retention is in event time, not
  wall time, because the state is part of the checkpoint and a replay must
  decide as the first run did. (A processing-time TTL would also replay
  identically, but Spark then runs an empty micro-batch on every trigger for
  ever and an ``--available-now`` run never ends: measured on Spark 4.1.)
- malformed rows come under a key of their own (:data:`MALFORMED_KEY`),
  leave no state and are all named (``malformed``); a small one carries its
  key and value through (``inline``, :data:`INLINE_RECORD_BYTES`, up to
  :data:`INLINE_BUDGET_BYTES` a task), so that the driver need not read the
  batch's records again from Kafka to copy it to the DLQ (reading a
  partition from its first malformed record to its last was an eighth of a
  run of make bench's topic). Late rows, and malformed ones past those
  limits, are named by position only and fetched by the driver.

Rows reach the operator packed (:func:`pack_by_key`, a ``mapInArrow`` before
the shuffle): one row per key and Arrow batch, holding that key's rows as
one Arrow IPC value. Spark's ``transformWithStateInPandas`` hands rows to
Python one by one (itertuples, then a DataFrame of them), which cost more
than everything the operator does with them; packed, a batch of 250,000
rows reaches it as a few hundred.

Copies of one ``event_id`` are expected to carry one event time; copies that
differ fall in different minutes and are not compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from adpipe.spark import keep_zip_directories

# Spark's Python workers import this module to run the operator and its packing.
keep_zip_directories()

MINUTE_MS = 60_000
# Keys per event minute (a hash of the event id): part of the checkpoint's
# state, so fixed for its life.
ID_BUCKETS = 8
DIGEST_BYTES = 16
DIGEST_DTYPE = f"S{DIGEST_BYTES}"
# What the operator emits: a row per closed (ad, minute) window, and a row
# per late, repeated-late or malformed input row (by position).
OUTPUT_SCHEMA = (
    "kind string, ad_id string, window_start_ms long, impressions long, clicks long, partition int, "
    "offset long, reject_reason string, event_id string, event_us long, watermark_ms long, "
    "inline boolean, key binary, value binary"
)
# A malformed record whose key and value together are at most this many
# bytes may carry them through the operator (``inline``)...
INLINE_RECORD_BYTES = 4096
# ... while a task's inline records are at most this many bytes together, so
# that the driver's collect of a hostile batch stays small.
INLINE_BUDGET_BYTES = 4 << 20
PAYLOAD_COLUMNS = ["inline", "key", "value"]
KIND_AGGREGATE = "aggregate"
KIND_LATE = "late"
KIND_REPEAT = "repeat"  # a late row whose event_id came before it: not listed
KIND_MALFORMED = "malformed"
# The key of malformed rows: no event minute is this far from 1970 (year 0001 is about -1e9).
MALFORMED_KEY = -(2**62)
_OUT_COLUMNS = [name.split()[0] for name in OUTPUT_SCHEMA.split(", ")]
KEY_COLUMNS = ["event_minute", "id_bucket"]
# What pack_by_key gives: the key and that key's rows, one Arrow IPC stream.
PACKED_SCHEMA = "event_minute long, id_bucket int, rows binary"
_PACKED_ARROW = pa.schema([("event_minute", pa.int64()), ("id_bucket", pa.int32()), ("rows", pa.binary())])
_COUNTS_SCHEMA = pa.schema([("ad_id", pa.string()), ("impressions", pa.int64()), ("clicks", pa.int64())])


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


def count_by_ad(ad_ids: pd.Series, event_types: pd.Series) -> pd.DataFrame:
    """Impressions and clicks per ad of the given (valid, distinct) rows."""
    clicks = (event_types == "click").to_numpy()
    frame = pd.DataFrame({"ad_id": ad_ids.to_numpy(dtype=object), "impressions": ~clicks, "clicks": clicks})
    return frame.groupby("ad_id", sort=False).sum().astype(np.int64).reset_index()


def add_counts(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    if old is None or old.empty:
        return new
    return pd.concat([old, new], ignore_index=True).groupby("ad_id", sort=False).sum().reset_index()


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def counts_to_bytes(counts: pd.DataFrame) -> bytes:
    return _ipc_bytes(pa.Table.from_pandas(counts, schema=_COUNTS_SCHEMA, preserve_index=False))


def counts_from_bytes(raw: bytes) -> pd.DataFrame:
    return pa.ipc.open_stream(pa.py_buffer(raw)).read_all().to_pandas()


def within_budget(table: pa.Table, spent: int, budget: int = INLINE_BUDGET_BYTES) -> tuple[pa.Table, int]:
    """``table``'s rows with ``inline`` (and their key and value) kept while
    the inline rows' bytes, after the ``spent`` before them, stay within
    ``budget``; and the bytes spent with them."""
    inline = table.column("inline").fill_null(False).to_numpy(zero_copy_only=False)
    if not inline.any():
        return table, spent
    key, value = (pc.binary_length(table.column(name)).fill_null(0) for name in ("key", "value"))
    sizes = np.where(inline, pc.add(key, value).to_numpy(zero_copy_only=False), 0)
    keep = inline & (spent + np.cumsum(sizes) <= budget)
    if (keep == inline).all():
        return table, spent + int(sizes.sum())
    mask = pa.array(keep)
    for name in ("key", "value"):
        carried = pc.if_else(mask, table.column(name), pa.scalar(None, pa.binary()))
        table = table.set_column(table.schema.get_field_index(name), name, carried)
    table = table.set_column(table.schema.get_field_index("inline"), "inline", mask)
    return table, spent + int(sizes[keep].sum())


def pack_by_key(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: each Arrow batch of rows (with the
    :data:`KEY_COLUMNS`) as one row per key holding that key's other columns
    (:data:`PACKED_SCHEMA`); :func:`unpack` reads them back. The
    :data:`PAYLOAD_COLUMNS` are kept for malformed rows only, within the
    task's :data:`INLINE_BUDGET_BYTES` (:func:`within_budget`)."""
    spent = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        table = pa.Table.from_batches([batch])
        if "inline" in table.column_names:
            table, spent = within_budget(table, spent)
        table = table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in KEY_COLUMNS]))
        minutes = table.column("event_minute").to_numpy()
        buckets = table.column("id_bucket").to_numpy()
        change = np.flatnonzero((minutes[1:] != minutes[:-1]) | (buckets[1:] != buckets[:-1])) + 1
        starts = np.concatenate([[0], change])
        lengths = np.diff(np.concatenate([starts, [table.num_rows]]))
        rows = table.drop_columns(KEY_COLUMNS)
        events = rows.drop_columns([c for c in PAYLOAD_COLUMNS if c in rows.column_names])
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(minutes[starts], pa.int64()),
                pa.array(buckets[starts], pa.int32()),
                pa.array(
                    [
                        _ipc_bytes((rows if minute == MALFORMED_KEY else events).slice(s, n))
                        for minute, s, n in zip(minutes[starts], starts, lengths, strict=True)
                    ],
                    pa.binary(),
                ),
            ],
            schema=_PACKED_ARROW,
        )


def unpack(packed: Iterator[pd.DataFrame]) -> pd.DataFrame:
    """The rows of one key's packed values (:func:`pack_by_key`), in
    (partition, offset) order."""
    tables = [pa.ipc.open_stream(pa.py_buffer(raw)).read_all() for frame in packed for raw in frame["rows"]]
    table = pa.concat_tables(tables).sort_by([("partition", "ascending"), ("offset", "ascending")])
    return table.to_pandas()


class MinuteState(StatefulProcessor):
    """Keyed by (event minute, id bucket) (minute :data:`MALFORMED_KEY` for
    malformed rows); input rows are :func:`pack_by_key`'s, of rows with
    ``partition``, ``offset``, ``reject_reason``, ``event_id``, ``ad_id``,
    ``event_type``, ``event_us``; output rows follow :data:`OUTPUT_SCHEMA`."""

    def __init__(self, retention_ms: int) -> None:
        self.retention_ms = retention_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen_digests", "digests binary")
        self.counts = handle.getValueState("window_counts", "counts binary")

    def handleInputRows(  # noqa: N802 - Spark's name
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: ANN401, N803
    ) -> Iterator[pd.DataFrame]:
        batch = unpack(rows)
        watermark_ms = max(int(timerValues.getCurrentWatermarkInMs()), 0)
        minute = int(key[0])
        if minute == MALFORMED_KEY:
            yield _rows(batch, KIND_MALFORMED, watermark_ms, payload=True)
            return
        known = self.seen.exists()
        seen = np.frombuffer(self.seen.get()[0], dtype=DIGEST_DTYPE) if known else np.zeros(0, DIGEST_DTYPE)
        repeats, after = find_repeats(seen, batch["event_id"].tolist())
        if after.size != seen.size:
            self.seen.update((after.tobytes(),))
        window_end_ms = (minute + 1) * MINUTE_MS
        if not known:
            self.handle.registerTimer(window_end_ms + self.retention_ms)
        if window_end_ms <= watermark_ms:  # closed before this batch: every row is late
            yield pd.concat(
                [
                    _rows(batch.loc[~repeats], KIND_LATE, watermark_ms),
                    _rows(batch.loc[repeats], KIND_REPEAT, watermark_ms),
                ],
                ignore_index=True,
            )
            return
        counted = batch.loc[~repeats]
        if counted.empty:
            return
        total = count_by_ad(counted["ad_id"], counted["event_type"])
        if self.counts.exists():
            total = add_counts(counts_from_bytes(self.counts.get()[0]), total)
        else:
            self.handle.registerTimer(window_end_ms)
        self.counts.update((counts_to_bytes(total),))

    def handleExpiredTimer(  # noqa: N802 - Spark's name
        self,
        key: Any,
        timerValues: Any,  # noqa: ANN401, N803
        expiredTimerInfo: Any,  # noqa: ANN401, N803
    ) -> Iterator[pd.DataFrame]:
        minute = int(key[0])
        window_end_ms = (minute + 1) * MINUTE_MS
        expiry_ms = int(expiredTimerInfo.getExpiryTimeInMs())
        if expiry_ms >= window_end_ms and self.counts.exists():
            counts = counts_from_bytes(self.counts.get()[0])
            self.counts.clear()
            watermark_ms = max(int(timerValues.getCurrentWatermarkInMs()), 0)
            yield _aggregates(counts, minute * MINUTE_MS, watermark_ms)
        if expiry_ms >= window_end_ms + self.retention_ms:
            self.seen.clear()

    def close(self) -> None:
        pass


def _aggregates(counts: pd.DataFrame, window_start_ms: int, watermark_ms: int) -> pd.DataFrame:
    n = len(counts)
    none = pd.Series([None] * n, dtype=object)
    return pd.DataFrame(
        {
            "kind": pd.Series([KIND_AGGREGATE] * n, dtype=object),
            "ad_id": counts["ad_id"].astype(object),
            "window_start_ms": np.full(n, window_start_ms, dtype=np.int64),
            "impressions": counts["impressions"].to_numpy(dtype=np.int64),
            "clicks": counts["clicks"].to_numpy(dtype=np.int64),
            "partition": none,
            "offset": none,
            "reject_reason": none,
            "event_id": none,
            "event_us": none,
            "watermark_ms": np.full(n, watermark_ms, dtype=np.int64),
            "inline": none,
            "key": none,
            "value": none,
        },
        columns=_OUT_COLUMNS,
    )


def _rows(rows: pd.DataFrame, kind: str, watermark_ms: int, payload: bool = False) -> pd.DataFrame:
    """Input rows named by position, as plain numpy and object columns
    (Arrow-backed input columns would reach Spark's serializer as chunked
    arrays); with ``payload``, the key and value of those that carry them
    (the rest are fetched by position)."""

    def objects(name: str) -> pd.Series:
        if name not in rows.columns:
            return none
        return pd.Series([None if pd.isna(v) else v for v in rows[name].tolist()], dtype=object)

    n = len(rows)
    none = pd.Series([None] * n, dtype=object)
    inline = (
        rows["inline"].fillna(False).to_numpy(dtype=bool)
        if payload and "inline" in rows.columns
        else np.zeros(n, dtype=bool)
    )
    return pd.DataFrame(
        {
            "kind": pd.Series([kind] * n, dtype=object),
            "ad_id": objects("ad_id"),
            "window_start_ms": none,
            "impressions": none,
            "clicks": none,
            "partition": rows["partition"].to_numpy(dtype=np.int32),
            "offset": rows["offset"].to_numpy(dtype=np.int64),
            "reject_reason": objects("reject_reason"),
            "event_id": objects("event_id"),
            "event_us": pd.Series([None if pd.isna(v) else int(v) for v in rows["event_us"].tolist()], dtype=object),
            "watermark_ms": np.full(n, watermark_ms, dtype=np.int64),
            "inline": inline,
            "key": objects("key") if payload else none,
            "value": objects("value") if payload else none,
        },
        columns=_OUT_COLUMNS,
    )
