"""The rows of ``make bench`` and how each engine is started: its command,
environment and output topics (:func:`launch`). adpipe runs as ``adpipe
stream``, Spark's two rows as ``python -m bench.spark_rows``, the other
peers as the scripts under ``bench/peers/`` in their own environments."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from adpipe import kafka_io
from adpipe.settings import Settings, load_settings
from adpipe.tools import demo

from bench.peers.peer_common import READY_LINE

ENGINES = (
    "io_floor", "spark_batch", "spark_alo", "adpipe", "adpipe_unaligned", "adpipe_cluster", "quixstreams", "pyflink"
)
# The rows that run `adpipe stream` itself (its log says when it processed).
ADPIPE_ROWS = ("adpipe", "adpipe_unaligned", "adpipe_cluster")
# adpipe with its watermark by Spark's rule (ADPIPE_WATERMARK_ALIGNMENT=off):
# what waiting for the slowest partition costs.
# adpipe on a local Spark standalone cluster of this many one-core workers
# (bench.comparison starts it for the row and stops it after).
CLUSTER_WORKERS = 2
STREAMING = ("adpipe", "adpipe_unaligned", "spark_alo", "quixstreams", "pyflink")  # the rows of --latency
BASELINE = "spark_batch"
PEERS_DIR = Path(__file__).parent / "peers"
# Where the harness is importable from: the project root, which is not
# installed (pip installs include/ only).
HARNESS_ROOT = Path(__file__).resolve().parent.parent


def parse_only(text: str | None) -> list[str]:
    """``--only a,b``: the rows to run, in the table's order."""
    if not text:
        return list(ENGINES)
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown:
        raise ValueError(f"unknown rows {', '.join(unknown)}; known: {', '.join(ENGINES)}")
    return [e for e in ENGINES if e in wanted]


def with_harness_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the project root first on PYTHONPATH: a ``python -m
    bench....`` child finds the harness whatever its working directory."""
    path = [str(HARNESS_ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


@dataclass(frozen=True)
class Context:
    """What every row of one bench run shares."""

    settings: Settings
    run_id: str
    work: Path
    pythons: dict[str, Path]


@dataclass(frozen=True)
class Launch:
    """How to start one engine on one input, and where its output lands."""

    cmd: list[str]
    env: dict[str, str]
    aggregates: str | None = None  # topic
    dlq: str | None = None  # topic
    aggregates_file: Path | None = None
    ready_marker: str = READY_LINE


def topic_name(ctx: Context, name: str) -> str:
    """A topic of this run's own."""
    return f"bench-{ctx.run_id}-{name}"


def launch(ctx: Context, engine: str, source: str, messages: int, continuous: bool = False, tag: str = "") -> Launch:
    """The command of ``engine`` reading ``source`` (``messages`` records
    in all; ``continuous``: until SIGTERM, for --latency), with output
    topics of its own (created here)."""
    settings = ctx.settings
    name = f"{engine}{tag}"
    folder = ctx.work / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ADPIPE_HOME": str(settings.home), "ADPIPE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    aggregates, dlq = topic_name(ctx, f"{name}-aggregates"), topic_name(ctx, f"{name}-dlq")
    job_id = f"bench-{ctx.run_id}-{name}"
    common = ["--bootstrap", settings.kafka_bootstrap, "--input", source, "--aggregates", aggregates, "--dlq", dlq]
    common += ["--job-id", job_id, "--work", str(folder)]
    bounded = ["--messages", "0" if continuous else str(messages), "--lateness-s", str(settings.watermark_delay_s)]
    if engine in ADPIPE_ROWS:
        env = {**demo.demo_env(settings, f"{ctx.run_id}-{name}"), "ADPIPE_TOPIC_EVENTS": source}
        if engine == "adpipe_cluster":
            from adpipe.local import spark_cluster

            env["ADPIPE_SPARK_MASTER"] = spark_cluster.master_url(settings)
        if engine == "adpipe_unaligned":
            env["ADPIPE_WATERMARK_ALIGNMENT"] = "off"
        own = load_settings(env)
        args = ["stream"] if continuous else ["stream", "--available-now"]
        return Launch(
            [sys.executable, "-m", "adpipe", *args],
            env,
            own.topics.aggregates,
            own.topics.dlq,
            ready_marker="adpipe.stream: stream job",
        )
    kafka_io.ensure_topics(settings.kafka, [aggregates, dlq], settings.topic_partitions)
    if engine in ("spark_batch", "spark_alo"):
        mode = ["batch"] if engine == "spark_batch" else ["alo", *(["--continuous"] if continuous else [])]
        cmd = [sys.executable, "-m", "bench.spark_rows", *mode, *common[2:]]
        env = with_harness_on_path(env)
        if engine == "spark_batch":
            return Launch(cmd, env, aggregates_file=folder / "aggregates.jsonl")
        return Launch(cmd, env, aggregates, dlq)
    if engine == "io_floor":
        return Launch([sys.executable, str(PEERS_DIR / "io_floor.py"), *common, *bounded], env)
    if engine == "quixstreams":
        return Launch(
            [str(ctx.pythons[engine]), str(PEERS_DIR / "quix_peer.py"), *common, *bounded], env, aggregates, dlq
        )
    if engine == "pyflink":
        flink = ["--jar", str(ctx.pythons["flink_jar"]), *(["--continuous"] if continuous else [])]
        env["FLINK_LOG_DIR"] = str(folder)  # the JobManager's log (checkpoints, commits) with the run's files
        return Launch(
            [str(ctx.pythons[engine]), str(PEERS_DIR / "flink_peer.py"), *common, *bounded, *flink],
            env,
            aggregates,
            dlq,
        )
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def timeout_for(messages: int) -> float:
    """How long a row may take before it is killed: generous (a slow
    engine is a result, a hung one is not)."""
    return 600.0 + messages / 1_000
