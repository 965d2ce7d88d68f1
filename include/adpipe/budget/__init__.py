"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event when an ad reaches its budget.

* :mod:`~adpipe.budget.service` - the consume loop, one database
  transaction per batch, the budget-event outbox.
* :mod:`~adpipe.budget.db` - tables, engine and pricing (SQLAlchemy Core).
* :mod:`~adpipe.budget.money` - the charge of one aggregate, budget periods.
* :mod:`~adpipe.budget.verify` - the budget part of ``adpipe verify``.
* :mod:`~adpipe.budget.cli` - ``adpipe budget`` (service, report, prices).

May import: the shared modules of ``adpipe`` (settings, money, kafka_io,
faults); no other part."""
