"""Tools around the pipeline, not part of it: they drive it through the
contract and check it from outside.

* :mod:`~adpipe.tools.produce` - seeded synthetic raw events and the
  producer's own summary of what it sent.
* :mod:`~adpipe.tools.verify` - the independent reconciliation (its own
  plain-Python reading of the raw events); :mod:`~adpipe.tools.table_verify`
  adds the Delta tables of an hour.
* :mod:`~adpipe.tools.demo` - ``adpipe demo``, which prints its story with
  :mod:`~adpipe.tools.story` (steps, progress bars, a closing table).
* :mod:`~adpipe.tools.chaos` - ``adpipe chaos``, the pipeline under random
  faults, judged by :mod:`~adpipe.tools.chaos.check`;
  :mod:`~adpipe.tools.status` - ``adpipe status``.
* :mod:`~adpipe.tools.cli` - those verbs, and ``adpipe jars``.
* :mod:`~adpipe.tools.class_archive_training` - ``adpipe jars``' training of
  the Spark drivers' class archives (its workloads use the lakehouse, so it
  sits here rather than beside the shared ``adpipe.class_archive``).
* :mod:`~adpipe.tools.constraints` - Airflow's constraints less the
  project's pins, for ``make python-packages`` (standard library only: it
  runs before anything is installed); :mod:`~adpipe.tools.container_health`
  - the healthchecks of docker-compose.yaml's adpipe services.

The benchmark is not here: it lives outside the package, in ``bench/`` at
the project root (``make bench``), and uses these tools.

May import: the parts, ``adpipe.local`` and the shared modules; nothing in
the package imports the tools but the command line (the tests and the
benchmark use them from outside)."""
