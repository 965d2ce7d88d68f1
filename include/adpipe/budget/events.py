"""Budget events: the outbox (``budget_events``, filled by
:mod:`adpipe.budget.status`) published to the budget-events topic; Step 9 of
the service's protocol (:mod:`adpipe.budget.commit`).

The publisher runs on its own thread, never the consuming one: a slow or
stuck publication cannot hold up consumption (and so cannot push the
instance past ``max.poll.interval.ms``). Each round (every
``ADPIPE_BUDGET_PUBLISH_INTERVAL_MS``, and at once after a batch made a
transition) first settles pause states against changed pricing
(``status.settle_pricing``), then publishes.

Budget events use a transactional producer whose ``transactional.id`` is
stable per database, so that "once" holds for read_committed readers of
``ad-budget-events``. A publish round:

  Step 1. Try the publisher lock (``pg_try_advisory_lock``; SQLite runs one
          instance): when another instance holds it, skip this round.
  Step 2. Unless this instance published the last round (``last_publisher``
          in ``budget_meta``) with the producer it still has, a fresh
          producer's ``init_transactions``: it fences every earlier
          publisher and completes or aborts its open transaction. Otherwise
          the long-lived producer goes on (no other publisher since).
  Step 3. Read the publish ledger: the last committed round R, kept as the
          committed offset of a ledger group in Kafka.
  Step 4. One database transaction: rows claimed by round R and not marked
          sent were published (R committed): mark them sent. Claim every
          other unsent row for round R+1; ``last_publisher`` = this instance.
  Step 5. One Kafka transaction: the events of round R+1 plus the ledger
          offset R+1 (``send_offsets_to_transaction``). Commit.
  Step 6. Mark round R+1 sent in the database; release the lock.

A death before Step 5's commit leaves round R+1 unpublished (aborted by the
next Step 2) and its rows unsent: the next round claims and publishes them.
A death after it (``budget_after_events_commit``) leaves the ledger at R+1:
the next round's Step 4 marks the rows sent without publishing them again.
A Kafka error drops the producer (the next round starts with Step 2's
fence); a database error skips the round. Neither stops the service.

This module is the thread and the round; the round's database side
(Steps 4 and 6) is :mod:`adpipe.budget.outbox`, its Kafka side (Steps 2, 3
and 5) :mod:`adpipe.budget.producer`.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import sqlalchemy as sa
from confluent_kafka import KafkaException
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from adpipe.budget import db, outbox, pricing, status
from adpipe.budget.producer import RoundProducer
from adpipe.faults import BUDGET_AFTER_EVENTS_COMMIT, FaultPlan
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class EventPublisher:
    """Publishes the outbox (``budget_events``) to the budget-events topic;
    the protocol is in the module doc."""

    def __init__(self, settings: Settings, engine: Engine, publisher_id: str, fault: FaultPlan | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.topic = settings.topics.budget_events
        self.kafka = RoundProducer(settings, publisher_id)
        self.instance = uuid.uuid4().hex
        self.fault = fault
        self.rounds = 0
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------ the thread

    def start(self, stop: threading.Event) -> None:
        """Publish on a thread of its own until ``stop`` is set; one last
        round then."""
        self.thread = threading.Thread(target=self._loop, args=(stop,), name="budget-events", daemon=True)
        self.thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.wait(self.settings.budget_publish_interval_s)
            self.wake.clear()
            self.round_safely()
        self.round_safely()
        self.close()

    def join(self, timeout: float = 90.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("the budget-events publisher did not finish within %.0f s", timeout)

    def round_safely(self) -> int:
        """Settle against changed pricing, then publish; any error is logged
        and the round retried later (the rows wait in the outbox)."""
        try:
            self.settle_pricing()
            return self.publish_pending()
        except KafkaException as exc:
            log.error("publishing budget events failed (they stay in the outbox and are retried): %s", exc)
            self.kafka.drop()
        except DBAPIError as exc:
            log.warning(
                "budget events: database unavailable (%s); retrying in %.0f s",
                str(exc).splitlines()[0],
                self.settings.budget_publish_interval_s,
            )
        except Exception:  # noqa: BLE001 - the thread must outlive any one round
            log.exception("budget events: round failed; retrying")
            self.kafka.drop()
        return 0

    def settle_pricing(self) -> int:
        """Pause and resume per the current pricing when it changed since the
        last settlement (checked without locks first: the common case)."""
        with self.engine.connect() as conn:
            settled = conn.execute(sa.select(db.meta.c.value).where(db.meta.c.key == db.PRICING_SETTLED)).scalar()
            if settled == pricing.load_price_book(conn).fingerprint():
                return 0
        with self.engine.begin() as conn:
            transitions = status.settle_pricing(conn) or []
        if transitions:
            log.info(
                "pricing changed: %d pause states changed: %s",
                len(transitions),
                ", ".join(f"{t.ad_id}@{t.period} {t.state}" for t in transitions[:20]),
            )
        return len(transitions)

    # ------------------------------------------------------------ one round

    def pending(self) -> int:
        return outbox.pending(self.engine)

    def publish_pending(self) -> int:
        """One publish round if anything is unsent and no other instance is
        publishing; returns events published."""
        if self.pending() == 0:
            return 0
        with self.engine.connect() as lock_conn:
            postgres = lock_conn.dialect.name == "postgresql"
            if postgres:  # Step 1
                got = lock_conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": db.LOCK_PUBLISHER}).scalar()
                lock_conn.commit()
                if not got:
                    log.debug("budget events: another instance is publishing; skipping this round")
                    return 0
            try:
                return self._round()
            finally:
                if postgres:
                    try:
                        lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": db.LOCK_PUBLISHER})
                        lock_conn.commit()
                    except DBAPIError as exc:  # the session ends anyway, and with it the lock
                        log.debug("advisory unlock: %s", exc)

    def _round(self) -> int:
        """Steps 2-6 of one publish round (the caller holds Step 1's lock)."""
        last = outbox.last_publisher(self.engine)
        if self.kafka.producer is None or last != self.instance:  # Step 2
            self.kafka.drop()
            self.kafka.open()
        last_round = self.kafka.last_round()  # Step 3
        next_round = last_round + 1
        confirmed, rows = outbox.claim(self.engine, self.instance, last_round, next_round)  # Step 4
        if confirmed:
            log.info("round %d of budget events was published before a crash: %d marked sent", last_round, confirmed)
        if not rows:
            return 0
        messages = [(row["ad_id"].encode(), json.dumps(self.event(row)).encode()) for row in rows]
        self.kafka.publish(messages, next_round)  # Step 5
        self.rounds += 1
        if self.fault:
            self.fault.hit(BUDGET_AFTER_EVENTS_COMMIT, self.rounds, len(rows))
        outbox.mark_sent(self.engine, next_round)  # Step 6
        log.info(
            "published %d budget events (round %d) to %s: %s",
            len(rows),
            next_round,
            self.topic,
            ", ".join(f"{r['event_type']} {r['ad_id']}@{r['period']}" for r in rows[:20])
            + (" ..." if len(rows) > 20 else ""),
        )
        return len(rows)

    def close(self) -> None:
        self.kafka.drop()

    @staticmethod
    def event(row: dict) -> dict:
        return {
            "event_id": row["event_id"],
            "event_type": row["event_type"],
            "ad_id": row["ad_id"],
            "period": row["period"],
            "generation": row["generation"],
            "cause": row["cause"],
            "spend_micros": row["spend_micros"],
            "budget_micros": row["budget_micros"],
            "spend": format_micros(row["spend_micros"]),
            "budget": None if row["budget_micros"] is None else format_micros(row["budget_micros"]),
            "reached_by_record_uuid": row["record_uuid"],
            "window_start": row["window_start"],
        }
