"""The embedded default's servers on this machine: the Kafka broker (KRaft,
from its jars), PostgreSQL (Debian's server) and Airflow (``make airflow``).

* :mod:`~adpipe.local.kafka_broker` - ``adpipe kafka up|down|status``.
* :mod:`~adpipe.local.postgres` - ``adpipe pg up|down|status``.
* :mod:`~adpipe.local.hdfs` - ``adpipe hdfs up|down|status``.
* :mod:`~adpipe.local.airflow` - ``make airflow``.
* :mod:`~adpipe.local.cli` - those verbs.

Nothing in the jobs depends on this package: they reach any broker or
database through the settings. May import: the shared modules of
``adpipe``; no other part."""
