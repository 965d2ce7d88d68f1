"""The stream driver's standby warm-up (which source it warms on), and the
Python workers it starts ahead of the first batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.stream import driver


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_TOPIC_EVENTS": "raw"})


def test_the_warm_up_starts_at_the_last_few_readable_records_of_each_partition(
    settings, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    # (first kept, after the last readable): a long partition, a short one, an empty one.
    bounds = {0: (0, 100), 1: (40, 42), 2: (7, 7)}
    monkeypatch.setattr(driver.kafka_io, "offset_bounds", lambda *_a, **_k: bounds)
    tail = json.loads(driver._tail_offsets(settings))
    assert tail == {"raw": {"0": 100 - driver.WARM_UP_TAIL, "1": 40, "2": 7}}


def test_no_tail_when_the_topic_is_empty_or_does_not_answer(settings, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(driver.kafka_io, "offset_bounds", lambda *_a, **_k: {0: (5, 5), 1: (0, 0)})
    assert driver._tail_offsets(settings) is None

    def down(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("Kafka at 127.0.0.1:9092 did not answer")

    monkeypatch.setattr(driver.kafka_io, "offset_bounds", down)
    assert driver._tail_offsets(settings) is None


def test_a_warm_up_that_fails_on_the_raw_topic_goes_on_with_a_rate_source(
    settings, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    ran: list[str] = []

    def run(_spark, _rows, source: str, _cut) -> None:  # noqa: ANN001
        ran.append(source)
        if source != "a rate source":
            raise RuntimeError("Partition raw-0's offset was changed from 95 to 98\nmore")

    monkeypatch.setattr(driver, "_tail_offsets", lambda _s: '{"raw": {"0": 95}}')
    monkeypatch.setattr(driver, "build_query_df", lambda *_a: "kafka rows")
    monkeypatch.setattr(driver, "_rate_rows", lambda *_a: "rate rows")
    monkeypatch.setattr(driver, "_warm_up_query", run)
    driver.warm_up(None, settings)
    assert ran == ["the raw topic's last records", "a rate source"]


def test_a_takeover_cuts_a_running_warm_up_short(spark, settings, monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # noqa: ANN001
    """A standby whose warm-up still runs when the checkpoint comes free
    stops it and takes over: its query is stopped, its thread ends."""
    import time

    from pyspark.sql import functions as F

    slow = F.udf(lambda v: time.sleep(30) or v, "long")
    monkeypatch.setattr(driver, "_tail_offsets", lambda _s: None)
    monkeypatch.setattr(
        driver, "_rate_rows",
        lambda spark, _s: spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
        .select(slow("value").alias("value")),
    )
    caplog.set_level("INFO", logger="adpipe.stream")
    started = time.monotonic()
    warming = driver.StandbyWarmUp(spark, settings, started)
    deadline = time.monotonic() + 60
    while not spark.streams.active and time.monotonic() < deadline:  # its query runs, in its first batch
        time.sleep(0.1)
    assert spark.streams.active and warming.thread.is_alive()
    warming.finish(timeout_s=30)
    assert not warming.thread.is_alive() and not spark.streams.active
    assert time.monotonic() - started < 30  # not the UDF's 30 s
    assert "warm-up query on a rate source stopped after 0 batches" in caplog.text
    assert "taking over" in caplog.text and "warm in" not in caplog.text
