"""The pure parts of ``make bench``'s side-by-side run (bench.comparison
and the modules it runs on): judging an output against the producer's
summary, the process-tree arithmetic, the rows, the ratios, the table, the
latency statistics; and the peers' own reading of the contract held to
adpipe verify's."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.tools import produce, verify

from bench import comparison, engines, latency, logs, processes, results
from bench.peers import peer_common
from tests.unit.helpers import aggregate

SUMMARY = {
    "messages": 7,
    "malformed": 2,
    "counts": [
        {"ad_id": "ad-000001", "window_start": "2026-11-22T12:00:00Z", "event_type": "impression", "events": 3},
        {"ad_id": "ad-000001", "window_start": "2026-11-22T12:00:00Z", "event_type": "click", "events": 1},
        {"ad_id": "ad-000002", "window_start": "2026-11-22T12:01:00Z", "event_type": "impression", "events": 1},
    ],
    "late_events": [],
}
BEFORE = "2026-11-22T12:30:00Z"


EXACT = [aggregate("ad-000001", "2026-11-22T12:00:00Z", 3, 1), aggregate("ad-000002", "2026-11-22T12:01:00Z", 1, 0)]


def test_an_exact_output_with_its_dlq_passes() -> None:
    check = results.judge(SUMMARY, EXACT, ["t/0/5", "t/1/9"], BEFORE)
    assert check["ok"] and check["dlq_judged"]
    assert (check["aggregates"], check["events_counted"], check["dlq"]) == (2, 5, 2)


def test_a_closer_window_past_before_is_not_judged() -> None:
    closer = aggregate("ad-000001", "2026-11-22T12:32:00Z", 1, 0)
    assert results.judge(SUMMARY, [*EXACT, closer], None, BEFORE)["ok"]
    assert not results.judge(SUMMARY, [*EXACT, closer], None, None)["ok"]


def test_no_dlq_is_not_judged_but_a_short_dlq_is_wrong() -> None:
    assert results.judge(SUMMARY, EXACT, None, BEFORE) | {"problems": []} == results.judge(SUMMARY, EXACT, None, BEFORE)
    assert results.judge(SUMMARY, EXACT, None, BEFORE)["dlq_judged"] is False
    short = results.judge(SUMMARY, EXACT, ["t/0/5"], BEFORE)
    assert not short["ok"] and short["lost"] == 1


def test_a_doubled_window_a_wrong_count_and_a_null_ad_are_wrong() -> None:
    doubled = results.judge(SUMMARY, [*EXACT, EXACT[1]], None, BEFORE)
    assert not doubled["ok"] and doubled["duplicated"] >= 1
    wrong = results.judge(SUMMARY, [aggregate("ad-000001", "2026-11-22T12:00:00Z", 2, 1), EXACT[1]], None, BEFORE)
    assert not wrong["ok"] and wrong["lost"] == 1
    null_ad = json.dumps({"record_uuid": "x", "ad_id": None, "window_start": "2026-11-22T12:00:00Z"}).encode()
    nulled = results.judge(SUMMARY, [*EXACT, null_ad], None, BEFORE)
    assert not nulled["ok"] and "without a string ad_id" in nulled["problems"][0]


def test_dlq_source_from_adpipe_header_or_peer_value() -> None:
    from adpipe.kafka_io import Record

    assert results.dlq_source(Record("d", 0, 0, None, b"raw", {"adpipe.source": b"t/1/2"})) == "t/1/2"
    assert results.dlq_source(Record("d", 0, 0, None, b'{"reason": "x", "source": "t/3/4"}', {})) == "t/3/4"
    assert results.dlq_source(Record("d", 0, 0, None, b"not json", {})) is None


def test_closer_plan_has_one_valid_event_per_ad() -> None:
    plan = comparison.closer_plan(3, datetime(2026, 11, 22, 12, 32, tzinfo=UTC))
    verdicts = [verify.classify(m.value) for m in plan.messages]
    assert [v.ad_id for v in verdicts] == ["ad-000000", "ad-000001", "ad-000002"]
    assert [m.key for m in plan.messages] == [b"ad-000000", b"ad-000001", b"ad-000002"]
    assert {v.window_start for v in verdicts} == {"2026-11-22T12:32:00Z"}


def test_parse_report_takes_the_last_report_line() -> None:
    text = 'noise\nBENCH-REPORT {"a": 1}\nmore\nBENCH-REPORT {"a": 2, "processing_s": 3.5}\n'
    assert processes.parse_report(text) == {"a": 2, "processing_s": 3.5}
    assert processes.parse_report("nothing") is None


def test_adpipe_processing_from_started_to_last_batch() -> None:
    log = (
        "2026-11-24 10:00:00,000 INFO adpipe.stream: stream job j started: query q, checkpoint c, available-now\n"
        "2026-11-24 10:00:04,500 INFO adpipe.stream: batch 0: input offsets 5 ...\n"
        "2026-11-24 10:00:10,250 INFO adpipe.stream: batch 1: input offsets 5 ...\n"
        "2026-11-24 10:00:11,000 INFO adpipe.stream: stream job j stopped after 2 batches\n"
    )
    assert logs.adpipe_processing_s(log) == 10.25
    assert logs.adpipe_processing_s("no lines") is None


def measured(wall: float, cpu: float = 4.0, rc: int = 0) -> processes.Measured:
    return processes.Measured(wall, cpu, 512.0, rc, None, Path("x.log"))


def test_rows_ratios_and_table() -> None:
    ok = {"ok": True, "problems": []}
    rows = [
        results.make_row("spark_batch", 1_000_000, measured(30.0), 20.0, ok),
        results.make_row("adpipe", 1_000_000, measured(60.0, 100.0), 50.0, ok),
        results.make_row("quixstreams", 1_000_000, measured(70.0), 62.5, {"ok": False, "problems": ["window lost"]}),
        results.make_row("pyflink", 1_000_000, measured(9.0, rc=1), None, None),
    ]
    results.add_ratios(rows)
    by = {r["engine"]: r for r in rows}
    assert by["spark_batch"]["events_per_s"] == 50_000 and by["spark_batch"]["ratio_to_batch"] == 1.0
    assert by["spark_batch"]["startup_s"] == 10.0
    assert by["adpipe"]["events_per_s"] == 20_000 and by["adpipe"]["ratio_to_batch"] == 0.4
    assert by["adpipe"]["cpu_s_per_million"] == 100.0
    assert by["quixstreams"]["counts"] == "WRONG" and by["quixstreams"]["ratio_to_batch"] is None
    assert by["pyflink"]["counts"] == "FAILED" and by["pyflink"]["events_per_s"] is None
    result = {
        "run_id": "r",
        "messages": 1_030_000,
        "events": 1_000_000,
        "ads": 50,
        "minutes": 30,
        "duplicates": 20_000,
        "malformed": 10_000,
        "rows": rows,
        "latency": [{"engine": "adpipe", "windows": 200, "p50_s": 6.0, "p99_s": 9.5, "max_s": 10.0,
                     "cpu_s_per_min": 12.5, "error": None}],
        "latency_rate": 5000.0,
        "latency_duration_s": 300.0,
    }
    table = results.render_table(result)
    assert "adpipe             20,000     0.40" in table
    assert "quixstreams counts WRONG (not ranked): window lost" in table
    assert "adpipe             200      6.0      9.5     10.0       12.5" in table


def test_latency_from_window_close_only_for_closed_windows() -> None:
    end = "2026-11-22T12:01:00Z"
    end_ms = datetime.fromisoformat(end).timestamp() * 1000
    arrivals = [(end, end_ms + 30_000 + 4_000), ("2026-11-22T12:02:00Z", end_ms + 60_000 + 30_000 + 8_000)]
    stats = latency.latency_stats(arrivals, 30_000, until_ms=end_ms + 60_000 + 30_000)
    assert stats == {"windows": 2, "p50_s": 4.0, "p99_s": 8.0, "max_s": 8.0}
    assert latency.latency_stats(arrivals, 30_000, until_ms=end_ms + 31_000)["windows"] == 1
    # Events sent 3 s after their event time: each window closes 3 s later on the wall clock.
    late_sent = latency.latency_stats(arrivals, 30_000, until_ms=end_ms + 90_000, send_lag_ms=3_000)
    assert late_sent == {"windows": 2, "p50_s": 1.0, "p99_s": 5.0, "max_s": 5.0}


def test_parse_only_keeps_the_table_order() -> None:
    assert engines.parse_only("pyflink,adpipe") == ["adpipe", "pyflink"]
    assert engines.parse_only(None) == list(engines.ENGINES)
    with pytest.raises(ValueError, match="unknown rows flonk"):
        engines.parse_only("flonk")


def test_tree_of_and_proc_table(tmp_path: Path) -> None:
    def stat(pid: int, ppid: int, ticks: int, pages: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", str(ppid), *["0"] * 9, str(ticks), str(ticks), *["0"] * 8, str(pages)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a (weird) name) " + " ".join(fields) + " 0 0\n")

    stat(10, 1, 100, 1), stat(11, 10, 50, 2), stat(12, 11, 0, 3), stat(20, 1, 7, 4)
    (tmp_path / "self").mkdir()
    table = processes.proc_table(tmp_path)
    assert table[11][0] == 10 and table[11][1] == pytest.approx(100 / processes._TICK)
    assert table[12][2] == 3 * processes._PAGE
    assert processes.tree_of(table, 10) == {10, 11, 12}


def test_a_tree_sampler_counts_the_serving_trees_from_their_cpu_at_its_start(tmp_path: Path) -> None:
    def stat(pid: int, ppid: int, ticks: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(ppid), *["0"] * 9, str(ticks), "0", *["0"] * 8, "1"]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p) " + " ".join(fields) + " 0 0\n")

    # The driver (10) just started; a worker (20) has run for a while, and so has a stranger (30).
    stat(10, 1, 0), stat(20, 1, 500), stat(30, 1, 900)
    sampler = processes.TreeSampler(10, extra_roots=(20,), proc_dir=tmp_path)
    # Then the driver works, the worker starts an executor (21) and both work.
    stat(10, 1, 100), stat(20, 1, 600), stat(21, 20, 300), stat(30, 1, 5000)
    sampler.sample()
    assert sum(sampler.cpu_by_pid.values()) == pytest.approx((100 + 100 + 300) / processes._TICK)
    assert 30 not in sampler.cpu_by_pid


def test_a_tree_sampler_counts_a_process_s_memory_from_its_second_sample(tmp_path: Path) -> None:
    def stat(pid: int, ppid: int, pages: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(ppid), *["0"] * 9, "0", "0", *["0"] * 8, str(pages)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p) " + " ".join(fields) + " 0 0\n")

    stat(10, 1, 1000)  # a JVM
    sampler = processes.TreeSampler(10, proc_dir=tmp_path)
    sampler.sample()
    assert sampler.peak_rss == 1000 * processes._PAGE
    # It spawns a command: the child shares its memory until it execs.
    stat(11, 10, 1000)
    sampler.sample()
    assert sampler.peak_rss == 1000 * processes._PAGE
    # A child still there at the next sample is a process of its own.
    stat(11, 10, 300)
    sampler.sample()
    assert sampler.peak_rss == 1300 * processes._PAGE


@pytest.mark.parametrize("kind", produce.MALFORMED_KINDS)
def test_the_peers_reading_of_a_malformed_kind_agrees_with_verify(kind: str) -> None:
    spec = produce.ProduceSpec(events=10, seed=3)
    import random

    message = produce._malformed(random.Random(1), spec, kind)
    assert peer_common.classify(message.value) == verify.classify(message.value)


def test_the_peers_reading_of_valid_events_and_edge_times_agrees_with_verify() -> None:
    plan = produce.plan(produce.ProduceSpec(events=300, seed=5))
    values = [m.value for m in plan.messages] + [
        b'{"event_id": "e", "ad_id": "a", "event_type": "click", "event_time": "2026-11-22T12:00+0130"}',
        b'{"event_id": "e", "ad_id": "a", "event_type": "click", "event_time": -1}',
        b'{"event_id": "e", "ad_id": "a", "event_type": "click", "event_time": "2026-11-22T12:00:00"}',
        b'{"event_id": "", "ad_id": "a", "event_type": "click", "event_time": 5}',
        b'{"event_id": "e", "event_id": "f", "ad_id": "a", "event_type": "click", "event_time": 5}',
        b"null",
        b"",
        b"\xff\xfe",
    ]
    for value in values:
        ours, theirs = peer_common.classify(value), verify.classify(value)
        if isinstance(theirs, str):
            assert ours == theirs, value
        else:
            assert (ours["event_id"], ours["ad_id"], ours["event_type"], ours["ms"]) == (
                theirs.event_id,
                theirs.ad_id,
                theirs.event_type,
                theirs.event_ms,
            ), value


def test_the_peers_apply_the_future_skew_rule() -> None:
    value = b'{"event_id": "e", "ad_id": "a", "event_type": "click", "event_time": 400001}'
    assert peer_common.classify(value, record_ms=100_000) == "future_event_time"
    assert isinstance(peer_common.classify(value, record_ms=100_001), dict)


def test_peer_scripts_import_nothing_of_adpipe_or_pyspark() -> None:
    for path in engines.PEERS_DIR.glob("*.py"):
        text = path.read_text()
        imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in imports if "adpipe" in line or "pyspark" in line], path
    assert str(engines.PEERS_DIR) not in sys.path  # they find peer_common as scripts, next to them


def test_proportional_bytes_reads_smaps_rollup(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "smaps_rollup").write_text("0-f ---p 0 00:00 0 [rollup]\nRss: 900 kB\nPss: 300 kB\n")
    assert processes.proportional_bytes(7, tmp_path) == 300 * 1024
    assert processes.proportional_bytes(8, tmp_path) is None


def test_the_alignment_cost_compares_the_two_adpipe_rows() -> None:
    from bench.results import alignment_cost

    rows = [{"engine": "adpipe", "events_per_s": 45_000}, {"engine": "adpipe_unaligned", "events_per_s": 50_000}]
    assert alignment_cost({"rows": rows}) == (
        "watermark alignment: 0.90 x the events/s without it (goal: within 10 %)"
    )
    latency = [{"engine": "adpipe", "p99_s": 6.6}, {"engine": "adpipe_unaligned", "p99_s": 6.0}]
    assert "1.10 x its p99 latency" in alignment_cost({"rows": rows, "latency": latency})
    assert alignment_cost({"rows": rows[:1]}) is None
