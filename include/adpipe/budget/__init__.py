"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event when an ad reaches its budget.

* :mod:`~adpipe.budget.service` - the consume loop.
* :mod:`~adpipe.budget.assignment` - the partitions held and where each
  reads from (the database's offsets; gaps); pausing for an outage.
* :mod:`~adpipe.budget.commit` - the commit protocol of a batch (one
  database transaction, then Kafka, then events); data faults split it.
* :mod:`~adpipe.budget.outage` - a database outage waited out.
* :mod:`~adpipe.budget.stats` - the service's metrics, batch log lines and
  totals.
* :mod:`~adpipe.budget.batch` - the database side of one batch: offsets,
  quarantine, ledger, spend, pauses (Steps 1-6).
* :mod:`~adpipe.budget.revisions` - a window's revisions: which are
  charged, against which base (``budget_windows``).
* :mod:`~adpipe.budget.status` - pause states and their transitions.
* :mod:`~adpipe.budget.events` - publishing the budget-event outbox (its
  thread and rounds); :mod:`~adpipe.budget.outbox` its database side,
  :mod:`~adpipe.budget.producer` its Kafka side.
* :mod:`~adpipe.budget.report` - spend, budget and status per ad and period.
* :mod:`~adpipe.budget.db` - tables, engine, database fault kinds
  (SQLAlchemy Core); :mod:`~adpipe.budget.schema` creates and upgrades
  them, :mod:`~adpipe.budget.writes` writes rows in bulk.
* :mod:`~adpipe.budget.pricing` - prices and budgets: the file, the table,
  an ad's price.
* :mod:`~adpipe.budget.aggregate` - the one parser of an aggregate record.
* :mod:`~adpipe.budget.money` - the charge of one aggregate, budget periods.
* :mod:`~adpipe.budget.retention` - ``budget prune``: the ledger's retention.
* :mod:`~adpipe.budget.verify` - the budget part of ``adpipe verify``.
* :mod:`~adpipe.budget.cli` - ``adpipe budget`` (service, report, prices).

May import: the shared modules of ``adpipe`` (settings, money, kafka_io,
faults); no other part."""
