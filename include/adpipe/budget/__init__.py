"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event when an ad reaches its budget.

* :mod:`~adpipe.budget.service` - the consume loop and the commit
  protocol of a batch (one database transaction, then Kafka, then events).
* :mod:`~adpipe.budget.batch` - the database side of one batch: offsets,
  quarantine, ledger, spend, pauses (Steps 1-6).
* :mod:`~adpipe.budget.events` - publishing the budget-event outbox.
* :mod:`~adpipe.budget.report` - spend, budget and status per ad and period.
* :mod:`~adpipe.budget.db` - tables, engine and pricing (SQLAlchemy Core).
* :mod:`~adpipe.budget.money` - the charge of one aggregate, budget periods.
* :mod:`~adpipe.budget.verify` - the budget part of ``adpipe verify``.
* :mod:`~adpipe.budget.cli` - ``adpipe budget`` (service, report, prices).

May import: the shared modules of ``adpipe`` (settings, money, kafka_io,
faults); no other part."""
