"""``adpipe stream --upgrade-checkpoint`` carries a checkpoint of the earlier
version of the stream job over, with real processes: the earlier version
(run from this repository's history) counts a first stretch of events and
stops with windows open; this version refuses its checkpoint and names the
upgrade; after the upgrade it counts on: the open windows come out once
with their old and new events, retries of events the old job counted are
repeats, and ``adpipe verify`` agrees.

Expectations come from the producers' summaries, never from the job."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.settings import PROJECT_ROOT
from confluent_kafka import Producer

from tests.integration.helpers import assert_exactly_once, reaped, start_adpipe

# The last version with one Python stateful operator and Spark's watermark.
EARLIER = "4e0952b"
START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
pytestmark = pytest.mark.slow


def _earlier_version(tmp: Path) -> Path:
    """The earlier version's package, exported from git, with the jar cache
    of this checkout (its own folder for adpipe's jar: one version's build
    would delete the other's)."""
    found = subprocess.run(["git", "cat-file", "-e", f"{EARLIER}^{{commit}}"], cwd=PROJECT_ROOT, check=False)
    if found.returncode != 0:
        pytest.skip(f"the earlier version ({EARLIER}) is not in this clone's history (a shallow clone?)")
    root = tmp / "earlier"
    root.mkdir()
    archive = subprocess.run(["git", "archive", EARLIER, "include"], cwd=PROJECT_ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    jvm = root / ".cache" / "jvm"
    jvm.mkdir(parents=True)
    for entry in (PROJECT_ROOT / ".cache" / "jvm").iterdir():
        if entry.name != "adpipe":
            (jvm / entry.name).symlink_to(entry)
    return root / "include"


def _stream(pipeline, *args: str, pythonpath: Path | None = None) -> tuple[int, str]:  # noqa: ANN001
    env = {**pipeline.env, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    proc, log_path = start_adpipe(pipeline.workdir, "stream", args, env)
    with reaped(proc):
        proc.wait(timeout=600)
    return proc.returncode, log_path.read_text()


def test_an_earlier_versions_checkpoint_is_upgraded_and_counted_on_exactly_once(pipeline, tmp_path) -> None:  # noqa: ANN001
    earlier = _earlier_version(tmp_path)
    first = pipeline.produce(events=1500, seed=81, minutes=6, start=START, duplicate_rate=0.03, atomic=True)
    rc, log = _stream(pipeline, "--available-now", "--max-offsets-per-trigger", "700", pythonpath=earlier)
    assert rc == 0, log[-3000:]
    old_windows = len(pipeline.aggregates())
    assert 0 < old_windows < 20 * 6  # the last minutes still open

    rc, log = _stream(pipeline, "--available-now")
    assert rc == 4 and "--upgrade-checkpoint" in log, log[-3000:]
    rc, log = _stream(pipeline, "--upgrade-checkpoint")
    assert rc == 0 and "open windows carried over" in log, log[-3000:]
    assert list(Path(pipeline.settings.checkpoint_uri.removeprefix("file://")).parent.glob("*.before-upgrade-*"))

    # Retries of events the old job read (repeats), new events of its open
    # minutes (counted with the old ones), then later minutes that close them.
    retries = pipeline.read(pipeline.settings.topics.events)[:40]
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    for rec in retries:
        producer.produce(pipeline.settings.topics.events, rec.value, rec.key)
    assert producer.flush(30) == 0
    second = pipeline.produce(events=500, seed=82, minutes=2, start=START + timedelta(minutes=5), atomic=True)
    third = pipeline.produce(events=200, seed=83, minutes=3, start=START + timedelta(minutes=7), atomic=True)
    rc, log = _stream(pipeline, "--available-now", "--max-offsets-per-trigger", "700")
    assert rc == 0, log[-3000:]
    assert "the upgraded checkpoint's first batch reads on from" in log
    assert_exactly_once(pipeline, [first, second, third], min_windows=20 * 7)
