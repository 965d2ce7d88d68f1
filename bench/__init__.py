"""adpipe's benchmark harness: ``make bench`` (adpipe side by side with
Spark, quixstreams and PyFlink, then the 10,000-ad hour) and ``make
bench-stages`` (each stage timed, and two sweeps); ``python -m bench`` from
the project root.

It lives outside ``include/`` on purpose: ``pip install .`` ships only the
package under ``include/``, and a user of adpipe needs none of this (nor
the peers it installs). The harness may import any of adpipe: it runs the
real commands and checks their output with the tools. Nothing under
``include/`` imports or launches it (``tests/unit/test_layout.py``).

* :mod:`~bench.cli` - the command line.
* :mod:`~bench.stages` - each stage timed as the real command; the stream
  job's batch-cap sweep and the budget service's batch-size sweep.
* :mod:`~bench.logs` - what the harness reads from adpipe's log lines.
* :mod:`~bench.comparison` - ``--peers``, the side-by-side run: the rows
  (:mod:`~bench.engines`, how each engine starts), installed by
  :mod:`~bench.install`, measured by :mod:`~bench.processes`, judged and
  tabled by :mod:`~bench.results`; with ``--latency``,
  :mod:`~bench.latency`.
* :mod:`~bench.spark_rows` - the program of the two Spark rows;
  ``peers/`` - the other engines' programs, standalone scripts run in their
  own environments."""
