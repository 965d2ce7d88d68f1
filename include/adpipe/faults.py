"""Fault injection for crash tests: SIGKILL this process at a named point.

``ADPIPE_FAULT`` names the point, ``ADPIPE_FAULT_BATCH`` the first batch id
at which it may fire (default 1); it fires once, at the first batch at or
after that id that has aggregates to write (with ``ADPIPE_FAULT_ON=records``:
any record, a batch of late or DLQ copies only included). When this process leads its own
process group (tests start the job with ``start_new_session``) the whole
group is killed, so Spark's JVM dies at the same instant, as in a machine
crash; otherwise the JVM follows as soon as its parent is gone."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

AFTER_PRODUCE = "after_produce"  # (a) records in the transaction, not committed
DURING_COMMIT = "during_commit"  # (c) EndTxn in flight
AFTER_COMMIT = "after_commit"  # (b) Kafka committed, Spark's checkpoint not
# The budget service (adpipe.budget.commit, adpipe.budget.events); "batch" is the number of the
# service's batch in this process (1, 2, ...), "records" the aggregates in it.
BUDGET_BEFORE_DB_TRANSACTION = "budget_before_db_transaction"  # a batch read, its transaction not begun
BUDGET_BEFORE_DB_COMMIT = "budget_before_db_commit"  # ledger, spend, offsets written, not committed
BUDGET_AFTER_DB_COMMIT = "budget_after_db_commit"  # database committed, Kafka offsets not
BUDGET_AFTER_EVENTS_COMMIT = "budget_after_events_commit"  # budget events in Kafka, outbox not marked sent
# Union & Load (adpipe.lakehouse.load); "batch" is the load run's id.
LOAD_AFTER_STAGE = "load_after_stage"  # rows staged, the ledger's "staged" row not written
LOAD_AFTER_PUBLISH = "load_after_publish"  # one published table written, the others and the ledger not
# A repair (adpipe.lakehouse.repair): its rebuilt hour written into one table, not the others nor its switch.
REPAIR_AFTER_WRITE = "repair_after_write"
POINTS = (
    AFTER_PRODUCE,
    DURING_COMMIT,
    AFTER_COMMIT,
    BUDGET_BEFORE_DB_TRANSACTION,
    BUDGET_BEFORE_DB_COMMIT,
    BUDGET_AFTER_DB_COMMIT,
    BUDGET_AFTER_EVENTS_COMMIT,
    LOAD_AFTER_STAGE,
    LOAD_AFTER_PUBLISH,
    REPAIR_AFTER_WRITE,
)


def freeze_now(point: str) -> None:
    """SIGSTOP this process alone (a zombie in the making: a test resumes it
    with SIGCONT long after its group session expired)."""
    log.warning("fault injection: SIGSTOP at %s", point)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)
    log.warning("fault injection: resumed (SIGCONT) at %s", point)


def kill_now(point: str) -> None:
    log.warning("fault injection: SIGKILL at %s", point)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class FaultPlan:
    point: str
    from_batch: int = 1
    delay_ms: int = 0
    on_any_record: bool = False
    freeze: bool = False  # ADPIPE_FAULT_SIGNAL=STOP: SIGSTOP instead of SIGKILL
    fired: list[str] = field(default_factory=list, compare=False)  # a resumed process carries on

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> FaultPlan | None:
        env = dict(os.environ if env is None else env)
        point = env.get("ADPIPE_FAULT", "")
        if not point:
            return None
        if point not in POINTS:
            raise ValueError(f"ADPIPE_FAULT={point!r}: expected one of {', '.join(POINTS)}")
        on = env.get("ADPIPE_FAULT_ON", "aggregates")
        if on not in ("aggregates", "records"):
            raise ValueError(f"ADPIPE_FAULT_ON={on!r}: expected aggregates or records")
        kind = env.get("ADPIPE_FAULT_SIGNAL", "KILL").upper()
        if kind not in ("KILL", "STOP"):
            raise ValueError(f"ADPIPE_FAULT_SIGNAL={kind!r}: expected KILL or STOP")
        return cls(
            point,
            int(env.get("ADPIPE_FAULT_BATCH", "1")),
            int(env.get("ADPIPE_FAULT_DELAY_MS", "0")),
            on == "records",
            kind == "STOP",
        )

    def armed(self, point: str, batch_id: int, aggregates: int, records: int = 0) -> bool:
        """``aggregates`` of the batch's ``records`` (all it writes)."""
        wanted = records if self.on_any_record else aggregates
        return self.point == point and batch_id >= self.from_batch and wanted > 0

    def hit(self, point: str, batch_id: int, aggregates: int, records: int = 0) -> None:
        if self.armed(point, batch_id, aggregates, records):
            if self.freeze:
                if point not in self.fired:
                    self.fired.append(point)
                    freeze_now(point)
            else:
                kill_now(point)

    def run_and_kill(self, action: Callable[[], None]) -> None:
        """Start ``action`` (the commit) and SIGKILL while it is in flight."""
        threading.Thread(target=action, daemon=True).start()
        time.sleep(self.delay_ms / 1000)
        kill_now(self.point)


def wait_group_gone(pgid: int, timeout_s: float = 30.0) -> None:
    """Wait until a killed process group is gone (a stream driver's JVM must
    be before its successor takes the checkpoint); SIGKILL what is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
