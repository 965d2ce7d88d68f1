"""The loads' ledger (``ads.load_runs``): which run staged, published,
failed or discarded which hours, what each region's Kafka coverage is, the
held hours, and the lock that lets one load run at a time."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse import tables as T
from adpipe.lakehouse.errors import LoadError
from adpipe.lakehouse.ranges import (
    Coverage,
)
from adpipe.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerState:
    next_run: int
    coverage: Coverage


def ledger_state(spark: SparkSession) -> LedgerState:
    """The next run's id and every offset loaded so far (the coverage of the
    latest ``staged`` row)."""
    # One pass over the ledger (max_by skips the rows its ordering leaves null).
    row = (
        spark.table(T.LOAD_RUNS)
        .agg(
            F.max("run_id").alias("last_run"),
            F.max_by("coverage", F.when(F.col("step") == "staged", F.col("run_id"))).alias("coverage"),
        )
        .first()
    )
    coverage = json.loads(row["coverage"]) if row is not None and row["coverage"] else {}
    return LedgerState(int(row["last_run"] or 0) + 1 if row is not None else 1, coverage)


def _append_ledger(
    spark: SparkSession, run_id: int, step: str, kind: str, hour: datetime | None, **fields: object
) -> None:
    row: dict[str, object] = dict.fromkeys(T.LOAD_RUNS_SCHEMA.fieldNames())
    row.update(run_id=run_id, step=step, kind=kind, hour=hour, at=datetime.now(UTC))
    row.update({k: v if isinstance(v, str) or v is None else json.dumps(v, default=str) for k, v in fields.items()})
    names = T.LOAD_RUNS_SCHEMA.fieldNames()
    spark.createDataFrame([tuple(row[n] for n in names)], T.LOAD_RUNS_SCHEMA).write.format("delta").mode(
        "append"
    ).saveAsTable(T.LOAD_RUNS)


def _finalized_hours(spark: SparkSession) -> set[str]:
    """Hours some run has published (or repaired): rows published into them
    later are late corrections."""
    done = spark.table(T.LOAD_RUNS).where(F.col("step").isin("published", "repaired")).select("hours").collect()
    return {h for r in done if r["hours"] for h in json.loads(r["hours"])}


@dataclass(frozen=True)
class HourStep:
    """An hour's last final ledger step: ``failed``, ``published``,
    ``repaired``, ``discarded`` or ``past_retention``, by which run, when,
    and its message."""

    step: str
    run_id: int
    at: datetime
    message: str

    def describe(self) -> str:
        return f"{self.step} by run {self.run_id} at {self.at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def last_steps(spark: SparkSession) -> dict[str, HourStep]:
    """Each hour's last ledger step of ``failed``, ``published``,
    ``repaired``, ``discarded`` or ``past_retention`` (hour label ->
    :class:`HourStep`)."""
    steps = (
        spark.table(T.LOAD_RUNS)
        .where(F.col("step").isin("failed", "published", "repaired", "discarded", T.STEP_PAST_RETENTION))
        .select("run_id", "step", "at", "hours", "message")
        .collect()
    )
    last: dict[str, HourStep] = {}
    for row in sorted(steps, key=lambda r: (r["run_id"], r["at"])):
        for hour in json.loads(row["hours"] or "[]"):
            last[hour] = HourStep(row["step"], row["run_id"], _utc(row["at"]), row["message"] or "")
    return last


def _utc(at: datetime) -> datetime:
    """A collected timestamp (naive, in the host's zone) as UTC."""
    return at.astimezone(UTC) if at.tzinfo is None else at


def held_hours(spark: SparkSession) -> dict[str, str]:
    """The hours held by a failed gate: their last final ledger step
    (:func:`last_steps`) is ``failed`` (an hour past retention is not held).
    Hour -> that failure's message. Their staged rows wait for an operator
    (a load asking for the hour again, ``--repair`` or ``--discard-staged``);
    other runs neither audit nor publish them, and are not held back."""
    return {hour: last.message for hour, last in last_steps(spark).items() if last.step == "failed"}


def shown_in_hour(spark: SparkSession, hour: datetime) -> Column:
    """Which published rows of ``hour`` are the hour as it stands, by the
    ledger's repairs (adpipe.lakehouse.repair): a completed repair's rows
    and later ones, never the rows it replaced; never the rows of a repair
    not completed. Those are deleted by the repair (or by the next load),
    but a reader outside the load lock (``verify --hour``) may come
    between. True when the hour was never repaired and no repair runs."""
    label = hour.astimezone(UTC).strftime("%Y-%m-%dT%H")
    rows = spark.table(T.LOAD_RUNS).where(F.col("step").isin("repairing", "repaired", "cleared")).collect()
    steps: dict[int, set[str]] = {}
    for row in rows:
        if label in json.loads(row["hours"] or "[]"):
            steps.setdefault(int(row["run_id"]), set()).add(row["step"])
    completed = [run for run, done in steps.items() if "repaired" in done]
    unfinished = [run for run, done in steps.items() if done == {"repairing"}]
    shown = F.lit(True)
    if completed:
        shown = shown & F.coalesce(F.col("load_run") >= F.lit(max(completed)), F.lit(False))
    if unfinished:
        shown = shown & (F.col("load_run").isNull() | ~F.col("load_run").isin(unfinished))
    return shown


def _failed_before(spark: SparkSession, hour: str, message: str, run_id: int) -> bool:
    """Whether an earlier run's gate failed ``hour`` with the same message
    (so its alert went out already)."""
    rows = spark.table(T.LOAD_RUNS).where((F.col("step") == "failed") & (F.col("run_id") < run_id)).collect()
    return any(json.loads(r["hours"] or "[]") == [hour] and r["message"] == message for r in rows)


LOCK_WAIT_S = 3600.0
_HELD: dict[str, int] = {}  # lock -> depth, in this process
# The deployment's load lock in PostgreSQL: an advisory lock in the
# metastore's database (advisory locks are per database: one per deployment).
LOAD_LOCK_KEY = "adpipe-load"
# The server ends the session of a holder whose host went silent (cut off,
# powered down) after about idle + interval x count seconds, and with it the lock.
_KEEPALIVES = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 3}
# The holder's side the same: its checks (lock_still_held) fail within about
# 25 s once the server is out of reach, rather than hang for TCP's minutes.
_CLIENT_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                      "tcp_user_timeout": 25_000}
_SESSIONS: dict[str, object] = {}  # lock -> the PostgreSQL connection holding it, in this process
_HOLDER = """
SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtext(%(key)s)::bigint >> 32) & 4294967295)::oid
  AND l.objid = (hashtext(%(key)s)::bigint & 4294967295)::oid
"""


def _waiting(what: str, holder: str, started: float, wait_s: float, logged: bool) -> bool:
    """Log the first wait for the load lock; raise past ``wait_s``."""
    if time.monotonic() - started > wait_s:
        raise LoadError(f"another load ({holder or 'gone'}) holds {what} too long")
    if not logged:
        log.info("waiting for the load lock (%s), held by %s", what, holder or "?")
    return True


@contextmanager
def _pg_lock(settings: Settings, wait_s: float) -> Iterator[None]:
    import psycopg2

    from adpipe.pg import connect, ensure_databases

    what = f"the advisory lock {LOAD_LOCK_KEY!r} in PostgreSQL database {settings.metastore_database}"
    try:
        ensure_databases(settings, (settings.metastore_database,))
        conn = connect(settings, settings.metastore_database, **_CLIENT_KEEPALIVES)
    except psycopg2.OperationalError as exc:
        raise LoadError(f"the load lock ({what} at {settings.pg_host}:{settings.pg_port}) is out of reach: "
                        f"{str(exc).strip()}") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SET application_name = %s", (f"adpipe load, pid {os.getpid()} on {socket.gethostname()}",))
            for name, value in _KEEPALIVES.items():
                cur.execute(f"SET {name} = {int(value)}")
            started, logged = time.monotonic(), False
            while True:
                cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (LOAD_LOCK_KEY,))
                if cur.fetchone()[0]:
                    break
                cur.execute(_HOLDER, {"key": LOAD_LOCK_KEY})
                holder = ", ".join(row[0] for row in cur.fetchall())
                logged = _waiting(what, holder, started, wait_s, logged)
                time.sleep(1.0)
            _SESSIONS[_lock_key(settings)] = conn
            try:
                yield
            finally:
                _SESSIONS.pop(_lock_key(settings), None)
                if not conn.closed:
                    try:
                        cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (LOAD_LOCK_KEY,))
                    except psycopg2.Error as exc:  # the session is gone, and the lock with it
                        log.warning("the load lock's session ended before its release: %s", str(exc).strip())
    finally:
        conn.close()


def _lock_key(settings: Settings) -> str:
    shared = settings.metastore == "postgres"
    return f"pg:{settings.metastore_database}" if shared else str(settings.home / "load.lock")


def lock_still_held(settings: Settings) -> None:
    """Raise LoadError unless this process still holds the load lock it
    took: its PostgreSQL session answers, and holds the advisory lock. A
    holder whose session the server ended (its host was cut off past the
    keepalives, the server restarted) has lost the lock, which another
    host may hold now: it must stop before writing anything more. Called
    before each write of staged or published rows. A no-op with Derby (a
    flock is not lost while its process lives)."""
    import psycopg2

    conn = _SESSIONS.get(_lock_key(settings))
    if conn is None:
        if settings.metastore == "postgres" and _HELD.get(_lock_key(settings)):
            raise LoadError("the load lock's session is gone")
        return
    try:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted "
                "AND objid = (hashtext(%s)::bigint & 4294967295)::oid",
                (LOAD_LOCK_KEY,),
            )
            held = cur.fetchone()[0] > 0
    except psycopg2.Error as exc:
        raise LoadError(
            f"lost the load lock: its PostgreSQL session ended ({str(exc).strip()}); another load may hold it now, "
            "so this one stops before writing"
        ) from exc
    if not held:
        raise LoadError("lost the load lock: its session no longer holds it; this load stops before writing")


@contextmanager
def _file_lock(settings: Settings, wait_s: float) -> Iterator[None]:
    settings.home.mkdir(parents=True, exist_ok=True)
    path = settings.home / "load.lock"
    with open(path, "a+") as handle:
        started, logged = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                logged = _waiting(str(path), f"pid {path.read_text().strip()}", started, wait_s, logged)
                time.sleep(1.0)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def load_lock(settings: Settings, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """One load step at a time per deployment: staging and publishing read
    the ledger and the tables and write them back, and run ids are claimed
    as the ledger's highest plus one. With the metastore in PostgreSQL (the
    default) the lock is an advisory lock in the metastore's database,
    shared by every host that loads into these tables; the server releases
    it when its holder's session ends (the process died, or its host went
    silent: TCP keepalives, about 25 s). With Derby (one JVM, so one host)
    it is a ``flock`` on ``ADPIPE_HOME/load.lock``. A second load waits
    (logging who holds the lock) rather than fail. Reentrant within a
    process: ``adpipe load`` takes it before its Spark session starts, so a
    waiting load never holds a cluster's cores that the running one needs
    (a deadlock ``adpipe chaos`` found), and its steps take it again."""
    shared = settings.metastore == "postgres"
    key = _lock_key(settings)
    if _HELD.get(key):  # this process holds it already (the CLI takes it before Spark starts)
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with (_pg_lock if shared else _file_lock)(settings, wait_s):
        _HELD[key] = 1
        try:
            yield
        finally:
            _HELD.pop(key, None)


def _failed_in_run(spark: SparkSession, run_id: int) -> set[str]:
    """The hours run ``run_id``'s audit leaves out of its publication (its
    ledger rows): those whose gate failed and those past retention."""
    steps = F.col("step").isin("failed", T.STEP_PAST_RETENTION)
    rows = spark.table(T.LOAD_RUNS).where((F.col("run_id") == run_id) & steps).collect()
    return {h for r in rows for h in json.loads(r["hours"] or "[]")}
