"""``adpipe bench --peers`` (``make bench``): adpipe side by side with the
engines it competes with, on one topic, every output checked.

The rows (``ENGINES``), each a process of its own started by this driver,
timed from the outside (wall clock, CPU seconds and peak resident memory of
its whole process tree) and from its own report (when it was ready, when it
saw its first record, when it was done):

1. ``io_floor``: one confluent-kafka consumer that reads (read_committed)
   and ``json.loads`` every record: what reading the topic costs at least.
2. ``spark_batch``: Spark's batch ceiling, adpipe's own transforms as one
   batch query over the topic (``adpipe.tools.bench_spark batch``).
3. ``spark_alo``: the same transforms as a streaming query with Spark's own
   at-least-once Kafka sink, ``availableNow`` (``bench_spark alo``).
4. ``adpipe``: ``adpipe stream --available-now``, exactly once, on topics
   and a job id of its own (``settings.isolated_env``).
5. ``quixstreams``: quixstreams 3.x, ``processing_guarantee="exactly-once"``
   (``peers/quix_peer.py``, in ``.cache/bench/quixstreams``).
6. ``pyflink``: PyFlink 2.x SQL with an exactly-once Kafka sink
   (``peers/flink_peer.py``, in ``.cache/bench/pyflink``, with the Kafka SQL
   connector jar from Maven Central).

The truth is the producer's own summary (``adpipe.tools.produce``): each
row's windows and DLQ are read back with read_committed and compared with it
by ``adpipe.tools.chaos.check.check_events``; a row that counts wrong is
reported, not ranked. Steady state is records / the engine's processing
time (first record to output committed); start-up is the rest of the wall
time. With ``--latency``: each streaming engine runs continuously while a
producer sends at a fixed rate, and the time from each window's close (its
end plus the watermark delay) to its aggregate being readable with
read_committed is measured. Results print as a table and are kept as JSON
under ``$ADPIPE_HOME/bench/<run>/``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.settings import Settings, load_settings
from adpipe.tools import bench, demo, produce
from adpipe.tools.chaos import check as chaos_check

ENGINES = ("io_floor", "spark_batch", "spark_alo", "adpipe", "quixstreams", "pyflink")
STREAMING = ("adpipe", "spark_alo", "quixstreams", "pyflink")  # the rows of --latency
BASELINE = "spark_batch"
PEERS_DIR = Path(__file__).parent / "peers"
REPORT_PREFIX = "BENCH-REPORT "
READY_LINE = "BENCH-READY"

# What `make bench` installs, each into .cache/bench/<venv>: pinned, so a
# second run needs no network.
VENVS = {"quixstreams": ("quixstreams==3.28.1",), "pyflink": ("apache-flink==2.3.0",)}
FLINK_CONNECTOR = ("org.apache.flink", "flink-sql-connector-kafka", "5.0.0-2.2")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


# --- Installing the peers ----------------------------------------------------


def bench_cache(settings: Settings) -> Path:
    """``.cache/bench`` beside the JVM jar cache."""
    return settings.jar_cache.parent / "bench"


def venv_python(cache: Path, venv: str) -> Path:
    return cache / venv / "bin" / "python"


def ensure_venv(cache: Path, venv: str, requirements: Sequence[str]) -> Path:
    """A virtual environment with ``requirements`` under ``cache/venv``,
    made once: a stamp holds what was installed, so a rerun does nothing."""
    stamp = cache / venv / ".installed"
    wanted = "\n".join(requirements)
    python = venv_python(cache, venv)
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    print(f"installing {', '.join(requirements)} into {cache / venv} (once)", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(cache / venv)], check=True)  # noqa: S603
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements], check=True)  # noqa: S603
    stamp.write_text(wanted)
    return python


def maven_url(group: str, artifact: str, version: str) -> str:
    return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def ensure_jar(cache: Path, coordinates: tuple[str, str, str] = FLINK_CONNECTOR) -> Path:
    """A jar from Maven Central into ``cache``, once, checked against the
    SHA-1 Maven Central publishes beside it."""
    group, artifact, version = coordinates
    jar = cache / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar
    url = maven_url(group, artifact, version)
    print(f"downloading {url}", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url + ".sha1", timeout=60) as response:  # noqa: S310 - a fixed https URL
        expected = response.read().decode().split()[0]
    with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310
        body = response.read()
    if hashlib.sha1(body).hexdigest() != expected:  # noqa: S324 - Maven Central's own checksum
        raise RuntimeError(f"{url}: SHA-1 does not match Maven Central's {expected}")
    tmp = jar.with_suffix(".part")
    tmp.write_bytes(body)
    tmp.replace(jar)
    return jar


def ensure_peers(settings: Settings, engines: Iterable[str]) -> dict[str, Path]:
    """Install what the chosen rows need; return the peers' interpreters
    (and the Flink connector jar under ``flink_jar``)."""
    cache = bench_cache(settings)
    found: dict[str, Path] = {}
    for engine in engines:
        if engine in VENVS:
            found[engine] = ensure_venv(cache, engine, VENVS[engine])
    if "pyflink" in found:
        found["flink_jar"] = ensure_jar(cache)
    return found


# --- Measuring a process tree ----------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def proc_table(proc_dir: Path = Path("/proc")) -> dict[int, tuple[int, float, int]]:
    """pid -> (parent pid, CPU seconds, resident bytes) of every process."""
    table: dict[int, tuple[int, float, int]] = {}
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE)
    return table


def tree_of(table: dict[int, tuple[int, float, int]], root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def proportional_bytes(pid: int, proc_dir: Path = Path("/proc")) -> int | None:
    """The process's proportional set size (its resident pages, a shared
    page divided among the processes sharing it: forked Python workers are
    not counted twice), or None when the kernel does not say."""
    try:
        for line in (proc_dir / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class TreeSampler:
    """Samples a process tree a few times a second: the peak of its summed
    memory (proportional set size, else resident), and the last CPU time
    seen of each of its processes (for those no one reaps into our rusage,
    such as a JVM left to init)."""

    root: int
    interval_s: float = 0.25
    peak_rss: int = 0
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        table = proc_table()
        pids = tree_of(table, self.root) & table.keys()
        memory = 0
        for pid in pids:
            pss = proportional_bytes(pid)
            memory += table[pid][2] if pss is None else pss
        self.peak_rss = max(self.peak_rss, memory)
        for pid in pids:
            self.cpu_by_pid[pid] = table[pid][1]

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Measured:
    """A finished process: how long, how much CPU and memory, its output."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    report: dict | None
    log: Path


def parse_report(text: str) -> dict | None:
    """The last ``BENCH-REPORT {json}`` line of a process's output."""
    found = None
    for line in text.splitlines():
        if line.startswith(REPORT_PREFIX):
            found = json.loads(line[len(REPORT_PREFIX) :])
    return found


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Running:
    """A process of the bench, its output going to ``log``, its tree sampled."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.log = log
        self._out = log.open("w")
        self.cpu_before = _children_cpu()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(  # noqa: S603
            list(cmd), env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
        )
        self.sampler = TreeSampler(self.proc.pid)
        self._thread = threading.Thread(target=self.sampler.run, daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float, marker: str = READY_LINE) -> bool:
        """Until the process prints ``marker`` (or dies, or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if marker in self.log.read_text(errors="replace"):
                return True
            time.sleep(0.5)
        return False

    def terminate(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def finish(self, timeout_s: float) -> Measured:
        """Wait for the end (SIGKILL of the group past ``timeout_s``)."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"   timed out after {timeout_s:.0f} s: killing it (see {self.log})", flush=True)
            self.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        wall = time.monotonic() - self.started
        self.sampler.stop()
        self._thread.join()
        self._out.close()
        reaped = _children_cpu() - self.cpu_before
        cpu = max(reaped, sum(self.sampler.cpu_by_pid.values()))
        text = self.log.read_text(errors="replace")
        return Measured(
            round(wall, 2),
            round(cpu, 2),
            round(self.sampler.peak_rss / 2**20, 1),
            self.proc.returncode,
            parse_report(text),
            self.log,
        )


# --- Judging an output ------------------------------------------------------


def judge(
    summary: dict, aggregates: list[bytes], dlq_sources: list[str | None] | None, before: str | None = None
) -> dict:
    """An engine's output against the producer's summary (``check_events``):
    only the windows starting before ``before`` (a closer's own windows,
    which only some engines emit, are not judged); the DLQ is judged when
    the engine writes one (``dlq_sources`` not None)."""
    truth = chaos_check.Truth.from_summaries([summary], closed_before=before)
    if dlq_sources is None:
        truth = dataclasses.replace(truth, malformed=0)
    judged, unreadable = [], 0
    for value in aggregates:
        body = json.loads(value)
        if not all(isinstance(body.get(k), str) for k in ("ad_id", "window_start", "record_uuid")):
            unreadable += 1
        elif before is None or body["window_start"] < before:
            judged.append(value)
    result = chaos_check.check_events(truth, judged, [], dlq_sources or [])
    if unreadable:
        result["ok"] = False
        result["problems"].insert(0, f"{unreadable} aggregates without a string ad_id, window_start or record_uuid")
    result["dlq_judged"] = dlq_sources is not None
    return result


def dlq_source(record: kafka_io.Record) -> str | None:
    """Where a DLQ record came from: adpipe's header, or a peer's JSON value."""
    header = record.header("adpipe.source")
    if header is not None:
        return header
    try:
        return json.loads(record.value or b"{}").get("source")
    except ValueError:
        return None


def read_values(settings: Settings, topic: str) -> list[bytes]:
    return [r.value for r in kafka_io.read_topic(settings.kafka, topic, timeout_s=300) if r.value is not None]


def read_dlq(settings: Settings, topic: str) -> list[str | None]:
    return [dlq_source(r) for r in kafka_io.read_topic(settings.kafka, topic, timeout_s=300)]


# --- Rows and the table -----------------------------------------------------


def adpipe_processing_s(log_text: str) -> float | None:
    """From ``adpipe stream`` output: from its ``stream job ... started``
    line to its last batch line (None when either is missing)."""
    started = last = None
    for line in log_text.splitlines():
        if "adpipe.stream: stream job" in line and " started" in line:
            started = bench.log_time(line)
        elif "adpipe.stream: batch " in line:
            last = bench.log_time(line) or last
    if started is None or last is None:
        return None
    return round((last - started).total_seconds(), 3)


def make_row(engine: str, messages: int, measured: Measured, processing_s: float | None, check: dict | None) -> dict:
    """One row of the table: steady-state events/s over the engine's own
    processing time, start-up the rest of its wall time, CPU seconds per
    million records, peak memory; ``counts`` exact, WRONG, or - (no output)."""
    processing = processing_s if processing_s else measured.wall_s
    failed = measured.returncode != 0
    return {
        "engine": engine,
        "messages": messages,
        "events_per_s": None if failed else round(messages / processing) if processing > 0 else None,
        "processing_s": processing,
        "startup_s": round(max(0.0, measured.wall_s - processing), 1),
        "wall_s": measured.wall_s,
        "cpu_s_per_million": round(measured.cpu_s * 1_000_000 / messages, 1) if messages else None,
        "peak_rss_mb": measured.peak_rss_mb,
        "returncode": measured.returncode,
        "counts": "FAILED" if failed else "-" if check is None else "exact" if check["ok"] else "WRONG",
        "check": check,
        "report": measured.report,
        "log": str(measured.log),
    }


def add_ratios(rows: list[dict], baseline: str = BASELINE) -> None:
    """Each row's events/s as a share of the baseline's (Spark's batch
    ceiling); a row that counts wrong or failed is not ranked."""
    base = next((r["events_per_s"] for r in rows if r["engine"] == baseline), None)
    for row in rows:
        ranked = row["counts"] in ("exact", "-") and row["events_per_s"] and base
        row["ratio_to_batch"] = round(row["events_per_s"] / base, 2) if ranked else None


def _fmt(value: object, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def render_table(result: dict) -> str:
    """The rows as a plain-text table (and the latency rows, if any)."""
    lines = [
        f"bench {result['run_id']}: {result['messages']:,} messages ({result['events']:,} events over "
        f"{result['ads']:,} ads and {result['minutes']} minutes, {result['duplicates']:,} retries, "
        f"{result['malformed']:,} malformed), {os.cpu_count()} cores",
        "",
        f"{'engine':<13}{'events/s':>10}{'x batch':>9}{'start-up s':>12}{'wall s':>9}"
        f"{'CPU s/M':>9}{'peak MB':>9}  counts",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['engine']:<13}{_fmt(row['events_per_s'], ','):>10}{_fmt(row['ratio_to_batch'], '.2f'):>9}"
            f"{_fmt(row['startup_s'], '.1f'):>12}{_fmt(row['wall_s'], '.1f'):>9}"
            f"{_fmt(row['cpu_s_per_million'], '.0f'):>9}{_fmt(row['peak_rss_mb'], '.0f'):>9}  {row['counts']}"
        )
    for row in result["rows"]:
        check = row.get("check")
        if check and not check["ok"]:
            lines.append(f"  {row['engine']} counts WRONG (not ranked): {'; '.join(check['problems'][:3])}")
    if result.get("latency"):
        lines += [
            "",
            f"latency at {result['latency_rate']:,.0f} events/s for {result['latency_duration_s']:.0f} s, "
            "window close (end + watermark delay) -> visible to read_committed:",
            f"{'engine':<13}{'windows':>9}{'p50 s':>9}{'p99 s':>9}{'max s':>9}",
        ]
        for row in result["latency"]:
            lines.append(
                f"{row['engine']:<13}{row['windows']:>9}{_fmt(row['p50_s'], '.1f'):>9}"
                f"{_fmt(row['p99_s'], '.1f'):>9}{_fmt(row['max_s'], '.1f'):>9}"
                + ("" if row.get("error") is None else f"  {row['error']}")
            )
    return "\n".join(lines)


# --- Running the rows -------------------------------------------------------


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


def _topic(ctx: Context, name: str) -> str:
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
    aggregates, dlq = _topic(ctx, f"{name}-aggregates"), _topic(ctx, f"{name}-dlq")
    job_id = f"bench-{ctx.run_id}-{name}"
    common = ["--bootstrap", settings.kafka_bootstrap, "--input", source, "--aggregates", aggregates, "--dlq", dlq]
    common += ["--job-id", job_id, "--work", str(folder)]
    bounded = ["--messages", "0" if continuous else str(messages), "--lateness-s", str(settings.lateness_ms // 1000)]
    if engine == "adpipe":
        env = {**demo.demo_env(settings, f"{ctx.run_id}-{name}"), "ADPIPE_TOPIC_EVENTS": source}
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
        cmd = [sys.executable, "-m", "adpipe.tools.bench_spark", *mode, *common[2:]]
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


def run_row(ctx: Context, engine: str, source: str, summary: dict, messages: int, before: str) -> dict:
    """One engine over the whole topic, its output judged."""
    how = launch(ctx, engine, source, messages)
    measured = Running(how.cmd, how.env, ctx.work / f"{engine}.log").finish(timeout_for(messages))
    processing = (measured.report or {}).get("processing_s")
    if engine == "adpipe":
        processing = adpipe_processing_s(measured.log.read_text(errors="replace"))
    check = None
    if measured.returncode == 0:
        if how.aggregates_file is not None and how.aggregates_file.exists():
            values = [line.encode() for line in how.aggregates_file.read_text().splitlines() if line]
            check = judge(summary, values, None, before)
        elif how.aggregates:
            values = read_values(ctx.settings, how.aggregates)
            check = judge(summary, values, read_dlq(ctx.settings, how.dlq) if how.dlq else None, before)
    return make_row(engine, messages, measured, processing, check)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def closer_plan(ads: int, at: datetime) -> produce.Plan:
    """One valid event per ad at ``at``: moves every engine's event time
    past the topic's last window, for every ad and partition (quixstreams
    closes a window only on a later record of the same key)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    messages = []
    for ad in range(ads):
        ad_id = f"ad-{ad:06d}"
        body = {"event_id": f"closer-{ad_id}", "ad_id": ad_id, "event_type": "impression", "event_time": stamp}
        messages.append(produce.Message(ad_id.encode(), json.dumps(body).encode(), "on_time"))
    return produce.Plan(messages, {"messages": len(messages)})


def throughput(ctx: Context, engines: Sequence[str], events: int, ads: int, seed: int) -> dict:
    """Every row over one topic of ``events`` (50 ads by default, 30
    minutes, 2 % retries, 1 % malformed) and a closer a few minutes later
    that closes the last windows for every engine and partition."""
    settings = ctx.settings
    source = _topic(ctx, "ad-events")
    kafka_io.ensure_topics(settings.kafka, [source], settings.topic_partitions)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=ads, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    print(f"producing {events:,} events over {ads:,} ads and 30 minutes to {source}", flush=True)
    started = time.monotonic()
    plan = produce.plan(spec)
    closing = closer_plan(ads, spec.start + timedelta(minutes=32))
    produce.send(settings.kafka, source, plan)
    produce.send(settings.kafka, source, closing)
    produce.write_summary(plan.summary, ctx.work / "produce-summary.json")
    messages = plan.summary["messages"] + closing.summary["messages"]
    print(f"   {messages:,} messages in {time.monotonic() - started:.0f} s", flush=True)
    before = _iso(spec.start + timedelta(minutes=spec.minutes))
    rows = []
    for i, engine in enumerate(engines, 1):
        print(f"[{i}/{len(engines)}] {engine} ...", flush=True)
        row = run_row(ctx, engine, source, plan.summary, messages, before)
        print(
            f"   {_fmt(row['events_per_s'], ',')} events/s steady, start-up {row['startup_s']} s, "
            f"wall {row['wall_s']} s, CPU {row['cpu_s_per_million']} s/M, peak {row['peak_rss_mb']} MB, "
            f"counts {row['counts']}",
            flush=True,
        )
        rows.append(row)
    add_ratios(rows)
    s = plan.summary
    return {
        "events": events,
        "ads": ads,
        "minutes": spec.minutes,
        "messages": messages,
        "duplicates": s["duplicates"],
        "malformed": s["malformed"],
        "topic": source,
        "rows": rows,
    }


# --- Latency ----------------------------------------------------------------


def latency_stats(
    arrivals: Iterable[tuple[str, float]], lateness_ms: int, until_ms: float, send_lag_ms: float = 0.0
) -> dict:
    """Seconds from each window's close (its end plus the watermark delay)
    to its aggregate being visible, for the windows that closed by
    ``until_ms`` (event time: the producer's last events; later windows never
    close). ``arrivals``: (window_end ISO, epoch ms first seen) per
    aggregate. ``send_lag_ms``: how long after its event time each event was
    sent (the producer plans its events, timed from when it starts planning,
    before it sends them): a window closes that much later on the wall clock."""
    delays = []
    for window_end, seen_ms in arrivals:
        close_ms = datetime.fromisoformat(window_end).timestamp() * 1000 + lateness_ms
        if close_ms <= until_ms:
            delays.append((seen_ms - close_ms - send_lag_ms) / 1000)
    return {
        "windows": len(delays),  # aggregates: (ad, window) pairs
        "p50_s": chaos_check.percentile(delays, 0.5),
        "p99_s": chaos_check.percentile(delays, 0.99),
        "max_s": max(delays) if delays else None,
    }


class Watcher:
    """A read_committed consumer of an output topic, in a thread: when each
    aggregate (by ad and window) first became visible."""

    def __init__(self, settings: Settings, topic: str) -> None:
        from confluent_kafka import Consumer

        self.first_seen: dict[tuple[str, str], float] = {}
        self.copies = 0
        self._stop = threading.Event()
        self._consumer = Consumer(
            kafka_io.client_config(
                settings.kafka,
                {
                    "group.id": f"adpipe-bench-watch-{topic}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 50,
                },
            )
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            now = time.time() * 1000
            body = json.loads(msg.value())
            key = (body["ad_id"], body["window_end"])
            if key in self.first_seen:
                self.copies += 1
            else:
                self.first_seen[key] = now
        self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def arrivals(self) -> list[tuple[str, float]]:
        """(window_end, epoch ms first visible) of each aggregate."""
        return [(window_end, seen) for (_, window_end), seen in self.first_seen.items()]


def latency_row(ctx: Context, engine: str, rate: float, duration_s: float, ads: int, seed: int) -> dict:
    """``engine`` running continuously on a topic of its own while a
    producer sends ``rate`` messages/s of events timed now for
    ``duration_s``; then the delays of the windows that closed."""
    settings = ctx.settings
    source = _topic(ctx, f"latency-{engine}-events")
    kafka_io.ensure_topics(settings.kafka, [source], settings.topic_partitions)
    how = launch(ctx, engine, source, 0, continuous=True, tag="-latency")
    running = Running(how.cmd, how.env, ctx.work / f"{engine}-latency.log")
    if not running.wait_ready(300, how.ready_marker):
        running.terminate()
        measured = running.finish(60)
        return {
            "engine": engine,
            "windows": 0,
            "p50_s": None,
            "p99_s": None,
            "max_s": None,
            "error": f"did not start (exit {measured.returncode}); see {measured.log}",
        }
    watcher = Watcher(settings, how.aggregates)
    # Events timed from now, spread over the duration; retries and malformed
    # ones among them, so that messages, not only events, arrive at ``rate``.
    # The send is paced so that it takes as long as the event times span
    # (whole minutes): event time then keeps to the wall clock.
    share = 1 + 0.02 + 0.01
    minutes = max(1, round(duration_s / 60))
    start = datetime.now(UTC)
    spec = produce.ProduceSpec(
        events=max(1, round(rate * minutes * 60 / share)),
        seed=seed,
        ads=ads,
        minutes=minutes,
        start=start,
        duplicate_rate=0.02,
        malformed_rate=0.01,
    )
    plan = produce.plan(spec)
    paced = len(plan.messages) / (minutes * 60)
    # Planning takes seconds: each event is sent this long after its event time.
    send_lag_ms = max(0.0, time.time() * 1000 - start.timestamp() * 1000)
    print(
        f"   {engine}: producing {paced:,.0f} messages/s for {minutes * 60} s "
        f"(each event sent {send_lag_ms / 1000:.1f} s after its event time)",
        flush=True,
    )
    produce.send(settings.kafka, source, plan, events_per_second=paced)
    until_ms = min(time.time() * 1000 - send_lag_ms, (start + timedelta(minutes=minutes)).timestamp() * 1000)
    time.sleep(settings.lateness_ms / 1000 + settings.trigger_interval_s + 30)  # the last closed windows' output
    watcher.stop()
    running.terminate()
    measured = running.finish(120)
    stats = latency_stats(watcher.arrivals(), settings.lateness_ms, until_ms, send_lag_ms)
    return {
        "engine": engine,
        **stats,
        "send_lag_s": round(send_lag_ms / 1000, 1),
        "copies": watcher.copies,
        "returncode": measured.returncode,
        "log": str(measured.log),
        "error": None,
    }


# --- The whole run ----------------------------------------------------------


def parse_only(text: str | None) -> list[str]:
    """``--only a,b``: the rows to run, in the table's order."""
    if not text:
        return list(ENGINES)
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown:
        raise ValueError(f"unknown rows {', '.join(unknown)}; known: {', '.join(ENGINES)}")
    return [e for e in ENGINES if e in wanted]


def run(
    settings: Settings,
    events: int = 1_000_000,
    ads: int = 50,
    engines: Sequence[str] = ENGINES,
    seed: int = 7,
    latency: bool = False,
    rate: float | None = None,
    latency_duration_s: float = 300.0,
) -> dict:
    """The side-by-side run (and with ``latency`` the latency rows); the
    result is kept as ``peers.json`` under ``$ADPIPE_HOME/bench/<run>/``."""
    from adpipe.local import kafka_broker

    run_id = "peers-" + time.strftime("%Y%m%d%H%M%S")
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(settings, run_id, work, ensure_peers(settings, engines))
    kafka_broker.up(settings)
    result: dict = {"run_id": run_id, "files": str(work)}
    result.update(throughput(ctx, engines, events, ads, seed))
    if latency:
        adpipe_rate = next((r["events_per_s"] for r in result["rows"] if r["engine"] == "adpipe"), None)
        chosen = rate or (adpipe_rate / 2 if adpipe_rate else 1_000.0)
        result.update({"latency_rate": chosen, "latency_duration_s": latency_duration_s, "latency": []})
        for engine in [e for e in engines if e in STREAMING]:
            print(f"latency: {engine} ...", flush=True)
            result["latency"].append(latency_row(ctx, engine, chosen, latency_duration_s, ads, seed + 2))
    (work / "peers.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
