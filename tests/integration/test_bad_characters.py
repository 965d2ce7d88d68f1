"""An id holding a NUL (or another control character, or an unpaired
surrogate) is malformed everywhere alike: the stream job sends it to the
DLQ (``bad_characters``), so no aggregate, table row or budget row holds it,
and ``adpipe budget --once`` and ``adpipe verify`` agree, with real
processes and a real PostgreSQL.

Expectations are this file's own: what it sent, priced with the budget
helpers' independent arithmetic."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

from adpipe import schemas as S
from confluent_kafka import Producer

from tests.integration.budget_helpers import BudgetEnv, independent_spend
from tests.integration.helpers import assert_exactly_once, make_pipeline

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_a_nul_or_a_lone_surrogate_in_an_id_is_malformed_for_the_stream_budget_and_verify(pg, tmp_path) -> None:  # noqa: ANN001
    budget = BudgetEnv(pg, tmp_path)
    pipeline = make_pipeline(tmp_path, {k: v for k, v in budget.env.items() if k.startswith("ADPIPE_BUDGET")})
    summary = pipeline.produce(events=400, seed=71, minutes=3, start=START, atomic=True)
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    bad = [
        *({"event_id": f"nul-{i}", "ad_id": "ad\u0000x", "event_type": "impression",
           "event_time": (START + timedelta(seconds=10 + i)).isoformat()} for i in range(5)),
        {"event_id": "lone", "ad_id": "ad-000001", "campaign_id": "c\ud800", "event_type": "click",
         "event_time": (START + timedelta(seconds=20)).isoformat()},
        {"event_id": "e\u001f", "ad_id": "ad-000002", "event_type": "click",
         "event_time": (START + timedelta(seconds=30)).isoformat()},
    ]
    for event in bad:
        producer.produce(pipeline.settings.topics.events, json.dumps(event).encode(), b"k")
    # Events of a later minute close the first minutes.
    later = pipeline.produce(events=20, seed=72, minutes=1, start=START + timedelta(minutes=5), atomic=True)
    assert producer.flush(30) == 0
    run = pipeline.stream(max_offsets=2000)
    assert run.returncode == 0, run.log[-3000:]

    dlq = Counter(r.header(S.HEADER_REASON) for r in pipeline.read(pipeline.settings.topics.dlq))
    assert dlq == Counter({S.REASON_BAD_CHARACTERS: len(bad)})
    aggregates = assert_exactly_once(pipeline, [summary, later], min_windows=20)
    assert all("\x00" not in a["ad_id"] for a in aggregates)

    charged = budget.cli("--once", extra_env={**pipeline.env, **budget.env,
                                               "ADPIPE_TOPIC_AGGREGATES": pipeline.settings.topics.aggregates})
    assert charged.returncode == 0, charged.log[-3000:]
    assert budget.query("SELECT count(*) FROM budget_quarantine") == [(0,)]
    records = pipeline.read(pipeline.settings.topics.aggregates)
    expected = independent_spend(records)
    spent = {key: amount for key, amount in budget.spend().items() if amount}
    assert spent == {key: amount for key, amount in expected.items() if amount}
    report = pipeline.verify()
    assert report["ok"] and report["budget"]["ok"], json.dumps(report, indent=1)
