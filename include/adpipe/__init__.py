"""adpipe: exactly-once ad event counting on Kafka, Spark and Delta.

The package is layered; imports point down only (``tests/unit/test_layout.py``
keeps it so):

* ``adpipe.cli`` - the ``adpipe`` command: a thin dispatcher to each
  package's own ``cli`` module.
* ``adpipe.tools`` - around the pipeline: synthetic producer, the
  independent verify, the demo, chaos, status, the class archives'
  training. (The benchmark harness is ``bench/`` at the project root,
  outside the package: nothing here imports or launches it.)
* ``adpipe.orchestration`` - what the Airflow DAGs in ``dags/`` call.
* the parts of the pipeline, none of which imports another:
  ``adpipe.stream`` (the aggregation job and its transactional sink),
  ``adpipe.lakehouse`` (Union & Load, Delta tables, metastore, the quality
  gate), ``adpipe.budget`` (the budget service), ``adpipe.local`` (the
  embedded default's servers: Kafka broker, PostgreSQL, Airflow).
* shared pieces of the contract, at the top of the package: ``settings``
  (the one place that reads configuration; ``setting_values`` reads and
  checks one value), ``kafka_access`` (topics, credentials, regions: how a
  client reaches Kafka), ``schemas``, ``raw_events``, ``kafka_io`` (the
  Kafka clients), ``spark`` (the one SparkSession builder), ``jars`` (JVM
  classpaths), ``pg``, ``money``, ``faults`` (named crash points),
  ``metrics`` (every Prometheus metric of the parts, and their /metrics).
"""

# The one place the version is written: pyproject.toml reads it, `adpipe
# --version` prints it, and it is the CHANGELOG's latest release (docs/development.md).
__version__ = "0.6.0"
