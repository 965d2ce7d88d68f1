"""The budget service and revisions of a window, on a real broker and a real
PostgreSQL: each revision charged once, by its difference from the revision
charged before; through SIGKILLs at each crash point, an instance killed
while revisions arrive, an older revision read after a newer one, a whole
topic replayed, and a database an earlier version (no revisions) charged.

Aggregates are written here (the contract's JSON, revisions numbered and
with full counts as the stream job writes them); every expectation is
computed here with Decimal arithmetic from what this file wrote
(``independent_spend``, ``expected_ledger`` of budget_helpers.py), never
with the service's code."""

from __future__ import annotations

import re
import signal

import pytest

from tests.integration.budget_helpers import (
    BudgetEnv,
    assignment,
    expected_ledger,
    finish,
    revision_record,
    revision_records,
    wait_until,
    window_histories,
)


def _fault(point: str, batch: int) -> dict[str, str]:
    return {"ADPIPE_FAULT": point, "ADPIPE_FAULT_BATCH": str(batch)}


def _all(histories: dict) -> set[tuple[str, str, int]]:
    return {(ad, ws, r) for (ad, ws), history in histories.items() for r, _i, _c in history}


def test_each_revision_charged_once_by_its_difference(budget: BudgetEnv) -> None:
    histories = window_histories(seed=3, ads=8, minutes=3, max_revision=3)
    revisions = sum(len(h) - 1 for h in histories.values())
    assert revisions > 20
    budget.copy(revision_records(histories, range(4)))  # revision 0 of every window, then 1, 2, 3

    run = budget.once()
    assert run.returncode == 0, run.log[-3000:]
    # Each revision's difference once; a window's charges add up to its latest revision's price.
    assert budget.ledger() == expected_ledger(histories, _all(histories))
    budget.assert_exact()
    totals = run.totals()
    assert (totals["applied"], totals.get("revised"), totals.get("superseded")) == (
        len(histories) + revisions,
        revisions,
        0,
    ), totals
    report = budget.cli("report")
    assert report.returncode == 0 and "paused" in report.log, report.log[-2000:]


@pytest.mark.parametrize(
    "point",
    ["budget_before_db_transaction", "budget_before_db_commit", "budget_after_db_commit", "budget_after_events_commit"],
)
def test_sigkill_while_a_batch_of_revisions_is_applied(budget: BudgetEnv, point: str) -> None:
    histories = window_histories(seed=5, ads=8, minutes=3, max_revision=3)
    budget.copy(revision_records(histories, range(1)))
    first = budget.once()  # revision 0 of every window: no ad reaches its budget yet
    assert first.returncode == 0, first.log[-3000:]
    assert first.totals()["applied"] == len(histories) and budget.budget_events() == {}
    # Every record from here on is a revision (1-3): each batch of the killed run carries them.
    later = revision_records(histories, range(1, 4))
    assert len(later) > 30
    budget.copy(later)
    small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
    killed = budget.once(_fault(point, 1 if point == "budget_after_events_commit" else 2), **small)
    assert killed.returncode == -signal.SIGKILL, killed.log[-3000:]
    assert f"fault injection: SIGKILL at {point}" in killed.log
    charged_before = budget.query("SELECT count(*) FROM budget_ledger")[0][0]
    if point == "budget_after_events_commit":  # the pauses of revisions published, the outbox not marked
        assert budget.query("SELECT count(*) FROM budget_events WHERE sent_at IS NULL")[0][0] > 0
    else:
        assert len(histories) < charged_before < len(histories) + len(later)  # batch 1 only (and 2 after commit)
        revised = budget.query("SELECT count(*) FROM budget_ledger WHERE base_revision IS NOT NULL")[0][0]
        assert revised == charged_before - len(histories)

    rerun = budget.once(**small)
    assert rerun.returncode == 0, rerun.log[-3000:]
    assert rerun.totals()["applied"] == len(histories) + len(later) - charged_before, rerun.totals()
    if point == "budget_after_events_commit":
        assert "was published before a crash" in rerun.log, rerun.log[-3000:]
    assert budget.ledger() == expected_ledger(histories, _all(histories))
    budget.assert_exact()


def test_two_instances_one_killed_while_revisions_arrive(budget: BudgetEnv) -> None:
    histories = window_histories(seed=7, ads=12, minutes=6, max_revision=3)
    first_emissions = revision_records(histories, range(1))
    later = revision_records(histories, range(1, 4))
    assert len(later) > 80
    small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
    survivor, survivor_log = budget.start(small)
    doomed = None
    try:
        wait_until("the first instance owning every partition", lambda: assignment(survivor_log) == [0, 1, 2, 3])
        budget.copy(first_emissions)
        wait_until(
            "revision 0 of every window charged",
            lambda: budget.query("SELECT count(*) FROM budget_ledger")[0][0] == len(histories),
        )
        # The second instance joins with revision 0 charged: each of its batches carries revisions alone.
        doomed, doomed_log = budget.start({**small, **_fault("budget_after_db_commit", 2)})
        wait_until(
            "two instances sharing the partitions",
            lambda: (a := assignment(doomed_log)) is not None
            and (b := assignment(survivor_log)) is not None
            and len(a) == len(b) == 2
            and not set(a) & set(b),
        )
        budget.copy(later, chunks=8)  # revisions 1, then 2, then 3, in eight transactions
        doomed.wait(timeout=90)
        assert doomed.returncode == -signal.SIGKILL, doomed_log.read_text()[-3000:]
        wait_until("the survivor owning every partition", lambda: assignment(survivor_log) == [0, 1, 2, 3])
        wait_until(
            "the survivor charging every revision",
            lambda: budget.query("SELECT count(*) FROM budget_ledger")[0][0] == len(histories) + len(later),
        )
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                finish(proc)
    assert survivor.returncode == 0, survivor_log.read_text()[-3000:]
    # The killed instance had charged revisions (batch 1 and the killed batch 2 committed).
    first_batch = r"batch 1: \d+ records: [1-9]\d* applied \(spend \+[0-9.]+; [1-9]\d* revisions charged by difference"
    assert re.search(first_batch, doomed_log.read_text()), doomed_log.read_text()[-3000:]
    assert budget.ledger() == expected_ledger(histories, _all(histories))
    budget.assert_exact()


def test_an_older_revision_after_a_newer_one_and_a_whole_topic_replay(budget: BudgetEnv) -> None:
    histories = window_histories(seed=11, ads=6, minutes=4, max_revision=3)
    with_r2 = {k: h for k, h in histories.items() if len(h) >= 3}
    assert len(with_r2) >= 5
    # Revisions 0 and 2 (1 held back), and per window with a revision 3 one with fewer clicks than revision 2.
    lower = [
        revision_record(ad, ws, 3, h[2][1] + 5, h[2][2] - 1)
        for (ad, ws), h in sorted(with_r2.items())
        if h[2][2] > 0 and len(h) == 3
    ]
    budget.copy(revision_records(histories, range(1)) + revision_records(histories, range(2, 3)) + lower)
    first = budget.once()
    assert first.returncode == 0, first.log[-3000:]
    assert first.totals()["conflicts"] == len(lower) > 0, first.totals()
    # Revisions 1, read after the 2s (older: not charged) or as a window's first revision above 0, and the 3s.
    budget.copy(revision_records(histories, range(1, 2)) + revision_records(histories, range(3, 4)))
    second = budget.once()
    assert second.returncode == 0, second.log[-3000:]
    assert second.totals()["superseded"] == len(with_r2), second.totals()
    charged = {(ad, ws, r) for (ad, ws), h in histories.items() for r, _i, _c in h if not (r == 1 and len(h) >= 3)}
    assert budget.ledger() == expected_ledger(histories, charged)
    expected = budget.assert_exact()
    before = budget.snapshot()
    quarantined = budget.query("SELECT count(*) FROM budget_quarantine WHERE kind = 'conflict'")
    assert quarantined == [(len(lower),)]
    shown = budget.cli("report")
    assert "CONFLICT" in shown.log and "fewer events" in shown.log, shown.log[-2000:]

    # The whole topic again: under a new consumer group, then with the database's offsets gone.
    all_records = budget.read()
    for replay in (budget.once(ADPIPE_BUDGET_GROUP=f"{budget.name}-replay"), None):
        if replay is None:
            budget.query("DELETE FROM budget_offsets RETURNING 1")
            replay = budget.once()
        assert replay.returncode == 0, replay.log[-3000:]
        totals = replay.totals()
        # Charged copies are duplicates, the older revisions superseded; the lower ones conflicts again.
        assert (totals["applied"], totals["duplicates"], totals["superseded"], totals["conflicts"]) == (
            0,
            len(charged),
            len(with_r2),
            len(lower),
        ), totals
        assert len(all_records) == len(charged) + len(with_r2) + len(lower)
        assert budget.snapshot() == before
    assert budget.assert_exact() == expected


def test_revisions_of_windows_an_earlier_version_charged(budget: BudgetEnv) -> None:
    """The database of an earlier version (no budget_windows, no revision
    columns) that charged revision 0 of every window: two instances start
    on it at once (both upgrade it); revisions 1-3 are charged against it,
    revision 0 never again."""
    histories = window_histories(seed=13, ads=8, minutes=3, max_revision=3)
    budget.copy(revision_records(histories, range(1)))
    assert budget.once().returncode == 0
    budget.query(
        "DROP TABLE budget_windows; DROP INDEX budget_ledger_unrevised_window; ALTER TABLE budget_ledger "
        "DROP COLUMN revision, DROP COLUMN base_revision, DROP COLUMN base_impressions, DROP COLUMN base_clicks; "
        "SELECT 1"
    )
    later = revision_records(histories, range(1, 4))
    # Revision 0 again too, under the same record_uuids (a replay), behind the revisions.
    budget.copy(later + revision_records(histories, range(1)))
    procs = [budget._popen(("--once",), {"ADPIPE_BUDGET_BATCH_SIZE": "10"}) for _ in range(2)]
    for proc, _log in procs:
        finish(proc, 120, terminate=False)
    for proc, log_path in procs:
        assert proc.returncode == 0, log_path.read_text()[-3000:]
    assert budget.ledger() == expected_ledger(histories, _all(histories))
    assert budget.query("SELECT count(*) FROM budget_ledger WHERE revision IS NULL") == [(len(histories),)]
    budget.assert_exact()
