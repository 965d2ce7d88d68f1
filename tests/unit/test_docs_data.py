"""docs/data.md's records are real: each example is read by adpipe's own
readers (the raw event by verify's reading, which test_raw_events holds to
the stream job's; the aggregate by the budget service's parser), each
record_uuid and budget event id is recomputed, and every reject reason and
header the code writes is named on the page."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from adpipe import schemas as S
from adpipe.budget.aggregate import parse_aggregate
from adpipe.budget.events import EventPublisher
from adpipe.budget.status import event_id
from adpipe.stream.job import record_uuid
from adpipe.tools.verify import RawEvent, classify_record

from tests.unit.helpers import DOCS, checked_blocks, doc_sections

DATA = DOCS / "data.md"
# The Kafka record timestamp the page's examples are read with.
RECORD_MS = int(datetime(2026, 11, 22, 12, 34, 57, tzinfo=UTC).timestamp() * 1000)
SKEW_MS = 300_000


def examples(kind: str) -> list[tuple[str, str]]:
    return [(what.split(" ", 1)[1] if " " in what else "", block)
            for what, block in checked_blocks(DATA) if what.split(" ", 1)[0] == kind]


def test_the_page_has_its_examples() -> None:
    kinds = [what.split(" ", 1)[0] for what, _ in checked_blocks(DATA)]
    assert (kinds.count("raw-event"), kinds.count("aggregate"), kinds.count("budget-event")) == (11, 2, 1)


@pytest.mark.parametrize(("verdict", "block"), examples("raw-event"))
def test_each_raw_event_example_gets_its_verdict(verdict: str, block: str) -> None:
    lines = block.splitlines()
    readings = [classify_record(line.encode(), RECORD_MS, SKEW_MS) for line in lines]
    if verdict == "valid":
        assert len(lines) == 1 and isinstance(readings[0], RawEvent), readings
    elif verdict == S.REASON_CONFLICTING_DUPLICATE:
        # Two valid copies of one event_id with two event times.
        first, later = readings
        assert isinstance(first, RawEvent) and isinstance(later, RawEvent)
        assert first.event_id == later.event_id and first.event_ms != later.event_ms
    else:
        assert readings == [verdict]


def test_every_reason_and_header_the_code_writes_is_named() -> None:
    text = DATA.read_text()
    reasons = {v for k, v in vars(S).items() if k.startswith("REASON_")}
    headers = {v for k, v in vars(S).items() if k.startswith("HEADER_")}
    assert len(reasons) == 11 and len(headers) == 10
    reasons_table = doc_sections(DATA)["Malformed records and their reasons"]
    for reason in reasons:
        assert f"| `{reason}` |" in reasons_table, f"reason {reason} is not in data.md's table"
    for header in headers | {"adpipe.kind"}:
        assert f"`{header}`" in text, f"header {header} is not in data.md"


@pytest.mark.parametrize("block", [b for _, b in examples("aggregate")])
def test_each_aggregate_example_parses_and_its_record_uuid_is_the_jobs(block: str) -> None:
    aggregate = parse_aggregate(block.encode())
    body = json.loads(block)
    assert list(body) == S.AGGREGATE_RECORD.fieldNames()  # the contract's fields, in its order
    start = datetime.fromisoformat(aggregate.window_start)
    assert datetime.fromisoformat(body["window_end"]) - start == (datetime(2026, 1, 1, 0, 1) - datetime(2026, 1, 1))
    job = examples("aggregate")[0][0]
    window_ms = int(start.timestamp() * 1000)
    assert aggregate.record_uuid == record_uuid(job, aggregate.ad_id, window_ms, aggregate.revision)


def test_the_budget_event_example_has_the_publishers_fields_and_id() -> None:
    [(_, block)] = examples("budget-event")
    body = json.loads(block)
    row = {name: None for name in ("event_id", "event_type", "ad_id", "period", "generation", "cause",
                                   "spend_micros", "budget_micros", "record_uuid", "window_start")}
    assert list(body) == list(EventPublisher.event({**row, "spend_micros": 0}))
    assert body["event_id"] == event_id(body["ad_id"], body["period"], body["generation"])
    assert EventPublisher.event({**body, "record_uuid": body["reached_by_record_uuid"]}) == body
