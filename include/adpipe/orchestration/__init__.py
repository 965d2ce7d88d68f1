"""Airflow-facing logic of adpipe: what the DAGs in ``dags/`` call.

* :mod:`adpipe.orchestration.alerts` - the one notifier of every DAG.
* :mod:`adpipe.orchestration.connections` - a task's settings from its Airflow
  Connections (Kafka, PostgreSQL, Spark).
* :mod:`adpipe.orchestration.stream_supervisor` - keeps the stream job alive.
* :mod:`adpipe.orchestration.load_tasks` - bodies of the hourly load DAG.
* :mod:`adpipe.orchestration.assets` - Airflow Assets of the published tables.
* :mod:`adpipe.orchestration.maintenance_tasks` - the daily OPTIMIZE and VACUUM
  of the Delta tables.

(``make airflow``, Airflow on this machine, is :mod:`adpipe.local.airflow`.)
May import: the parts (``adpipe.stream``, ``adpipe.lakehouse``) and the
shared modules; not ``adpipe.local`` nor the tools.

DAG files import these at parse time, so module level stays light: no
Spark, no Kafka client, no I/O until a task runs."""
