"""``python -m bench --failover --part budget``: how long a budget
instance's partitions go unread after the instance is SIGKILLed, its group
on KIP-848's consumer protocol or on the classic one.

One run: a fresh aggregates topic (4 partitions), consumer group and
PostgreSQL database; a producer writing synthetic aggregates in small Kafka
transactions at ``rate`` a second for the whole run; two ``adpipe budget``
instances. Then ``faults`` times: wait until both hold partitions (each
one's last "assignment now" line), SIGKILL one of them (picked at random)
with its process group at a random moment, and time the fault to the
moment every partition it held has been charged past where it stood at the
kill (its row in ``budget_offsets`` moved: the survivor took it over and
committed a batch of it); a new instance is then started in its place. At
the end the producer stops, the instances drain and stop, and the ledger
must hold each distinct record_uuid once with the spend a plain-Python sum
gives. Prints p50, p99 and the worst; keeps them as JSON under
``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adpipe import kafka_io
from adpipe.budget import db
from adpipe.budget.batch import stored_offsets
from adpipe.local import kafka_broker, postgres
from adpipe.processes import start_detached
from adpipe.settings import Settings, load_settings

from bench.failover import percentiles, stop_all, wait
from bench.stages import (
    budget_env,
    database_name,
    expected_spend,
    ledger_totals,
    new_run,
    synthetic_aggregates,
)

PARTITIONS = 4
_ASSIGNMENT = re.compile(r"assignment now \[([0-9, ]*)\]")


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def partitions(self) -> set[int] | None:
        """What its log last said it holds (None: nothing said yet)."""
        found = _ASSIGNMENT.findall(self.log_path.read_text(errors="replace"))
        return {int(p) for p in found[-1].split(",") if p.strip()} if found else None


def _start(env: dict[str, str], work: Path, name: str) -> Instance:
    log_path = work / f"{name}.log"
    proc = start_detached([sys.executable, "-m", "adpipe", "budget"], log_path, env=env)
    return Instance(name, proc, log_path)


def produce_aggregates(
    settings: Settings,
    topic: str,
    values: list[dict],
    rate: float,
    stop: threading.Event,
    sent: list[dict],
    on_commit: Callable[[float], None] | None = None,
) -> None:
    """``values`` (key ad_id) in transactions of a fifth of a second's worth,
    at ``rate`` a second, until stopped or spent, as the stream job writes
    them; what was committed goes to ``sent``, and ``on_commit(begun_at)``
    hears of each commit. A transaction the broker aborts (its coordinator
    died with it) is sent again."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({**kafka_io.client_config(settings.kafka), "transactional.id": f"adpipe-bench-{topic}",
                         "linger.ms": 5})
    producer.init_transactions(30)
    per_round = max(1, int(rate / 5))
    first = 0
    while first < len(values) and not stop.is_set():
        started = time.monotonic()
        chunk = values[first : first + per_round]
        producer.begin_transaction()
        for a in chunk:
            producer.produce(topic, key=a["ad_id"].encode(), value=json.dumps(a).encode())
        try:
            _commit(producer)
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(60)
            continue
        sent.extend(chunk)
        first += per_round
        if on_commit:
            on_commit(started)
        stop.wait(max(0.0, 0.2 - (time.monotonic() - started)))


def _commit(producer) -> None:  # noqa: ANN001 - a confluent_kafka Producer
    """Commit, asking again while the error is retriable (a coordinator
    moving to another broker)."""
    from confluent_kafka import KafkaException

    while True:
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise


def run(settings: Settings, faults: int = 10, rate: float = 50.0, protocol: str = "consumer", seed: int = 7) -> dict:
    """The measurement (module doc); its summary."""
    run_id, work = new_run(settings, f"budget-failover-{protocol}")
    kafka_broker.up(settings)
    postgres.up(settings)
    topic = f"bench-{run_id}-aggregates"
    kafka_io.ensure_topics(settings.kafka, [topic], PARTITIONS)
    database = database_name(run_id)
    env = budget_env(settings, run_id, "", topic, database, ADPIPE_BUDGET_GROUP_PROTOCOL=protocol,
                     ADPIPE_BUDGET_BATCH_SIZE="200")
    job = load_settings(env)
    engine = db.make_engine(job)
    # Enough for the whole run at the rate, ads spread over the partitions by key.
    values = synthetic_aggregates(int(rate * (60 + 40 * faults)), ads=200, seed=seed, duplicate_rate=0.0)
    sent: list[dict] = []
    stop = threading.Event()
    producer = threading.Thread(target=produce_aggregates, args=(settings, topic, values, rate, stop, sent),
                                daemon=True)
    rng = random.Random(seed)
    seconds: list[float] = []
    count = iter(range(1_000_000))
    instances = [_start(env, work, f"budget-{next(count)}") for _ in range(2)]
    started = list(instances)
    producer.start()

    def both_hold() -> bool:
        held = [i.partitions() for i in instances]
        return all(held) and set().union(*held) == set(range(PARTITIONS))  # type: ignore[arg-type]

    def offsets(partitions: set[int]) -> dict[int, int]:
        with engine.connect() as conn:
            return stored_offsets(conn, job.budget_group, topic, sorted(partitions))

    try:
        for n in range(1, faults + 1):
            wait(f"two instances holding partitions (fault {n})", both_hold, 300)
            time.sleep(rng.uniform(2.0, 6.0))
            victim = instances.pop(rng.randrange(2))
            held = victim.partitions() or set()
            before = offsets(held)
            fault_at = time.monotonic()
            os.killpg(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
            wait(f"partitions {sorted(held)} charged again (fault {n})",
                  lambda h=held, b=before: all(offsets(h).get(p, -1) > b.get(p, -1) for p in h), 600)
            seconds.append(time.monotonic() - fault_at)
            print(f"  fault {n}/{faults}: SIGKILL of {victim.name} (partitions {sorted(held)}), charged again "
                  f"{seconds[-1]:.1f} s after it", flush=True)
            replacement = _start(env, work, f"budget-{next(count)}")
            instances.append(replacement)
            started.append(replacement)
        stop.set()
        producer.join(timeout=60)
        ends = kafka_io.end_offsets(settings.kafka, topic)

        def drained() -> bool:
            charged = offsets(set(ends))
            ranges = {p: (charged.get(p, 0), end) for p, end in ends.items()}
            return not kafka_io.readable_partitions(settings.kafka, topic, ranges)

        wait("the survivors draining", drained, 300)
    finally:
        stop.set()
        stop_all([instance.proc for instance in started], 60)
        engine.dispose()
    distinct, spend = expected_spend(sent, job.budget_default_cpm_micros, job.budget_default_cpc_micros)
    rows, charged = ledger_totals(settings, database)
    summary = {"run": run_id, "part": "budget", "protocol": protocol, "rate": rate,
               "session_timeout_ms": job.budget_session_timeout_ms, **percentiles(seconds),
               "exact": rows == distinct and charged == spend, "ledger_rows": rows, "distinct_sent": distinct,
               "logs": str(work)}
    (work / "failover.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
