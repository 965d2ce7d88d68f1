"""Read what Spark's checkpoint says about one micro-batch.

Spark writes ``offsets/N`` (the batch's end offsets and its watermark)
before it runs batch N and ``commits/N`` after the sink returned. A batch
replayed after a crash therefore reads the very same entries here, which is
what makes the late/DLQ routing of a replay identical to the first run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Spark's offset JSON for "the partition's earliest offset".
EARLIEST = -2


class OffsetLogError(RuntimeError):
    """The checkpoint lacks an entry the running batch must have."""


@dataclass(frozen=True)
class BatchOffsets:
    batch_id: int
    topic: str
    start: dict[int, int]
    end: dict[int, int]
    # The watermark Spark evicts state with in this batch (windows whose end
    # is <= it are emitted now).
    watermark_ms: int
    # The watermark Spark's first stateful operator drops input rows with in
    # this batch: the previous batch's watermark (SPARK-40925 propagation).
    late_watermark_ms: int

    @property
    def input_offsets(self) -> int:
        return sum(self.end[p] - self.start.get(p, 0) for p in self.end)

    def has_input(self) -> bool:
        return any(self.end[p] > self.start.get(p, 0) for p in self.end)

    def kafka_json(self, which: str) -> str:
        """Spark's ``startingOffsets`` / ``endingOffsets`` of this batch, over
        the batch's partitions. A partition added to the topic since the
        previous batch has no start yet: it is read from its earliest offset
        (-2), as Spark's stream source reads a newly discovered partition."""
        if which == "start":
            offsets = {p: self.start.get(p, EARLIEST) for p in self.end}
        else:
            offsets = self.end
        return json.dumps({self.topic: {str(p): o for p, o in sorted(offsets.items())}})

    def kafka_assign(self) -> str:
        """Spark's ``assign`` option: exactly this batch's partitions (the
        topic may have more by now)."""
        return json.dumps({self.topic: sorted(self.end)})


def _json_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError as exc:
        raise OffsetLogError(f"missing checkpoint entry {path}") from exc
    # The first line is a version tag (sometimes preceded by a length byte).
    return [line for line in text.splitlines()[1:] if line.strip()]


def _source_offsets(line: str) -> tuple[str, dict[int, int]]:
    parsed = json.loads(line)
    if len(parsed) != 1:
        raise OffsetLogError(f"expected offsets of one topic, got {sorted(parsed)}")
    ((topic, offsets),) = parsed.items()
    return topic, {int(p): int(o) for p, o in offsets.items()}


def _entry(checkpoint: Path, batch_id: int) -> tuple[int, str, dict[int, int]]:
    lines = _json_lines(checkpoint / "offsets" / str(batch_id))
    metadata = json.loads(lines[0])
    topic, offsets = _source_offsets(lines[1])
    return int(metadata.get("batchWatermarkMs", 0)), topic, offsets


def batch_offsets(checkpoint: Path, batch_id: int) -> BatchOffsets:
    watermark, topic, end = _entry(checkpoint, batch_id)
    if batch_id == 0:
        late_watermark = 0
        initial = _json_lines(checkpoint / "sources" / "0" / "0")
        start_topic, start = _source_offsets(initial[0]) if initial else (topic, {})
        if start_topic != topic:
            raise OffsetLogError(f"initial offsets name topic {start_topic}, batch 0 names {topic}")
    else:
        late_watermark, _topic, start = _entry(checkpoint, batch_id - 1)
    return BatchOffsets(batch_id, topic, start, end, watermark, late_watermark)


def last_committed_batch(checkpoint: Path) -> int | None:
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.glob("[0-9]*")] if commits.exists() else []
    return max(ids) if ids else None


def query_id(checkpoint: Path) -> str | None:
    try:
        return json.loads((checkpoint / "metadata").read_text())["id"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None
