"""spark-submit entry point of the hourly Union & Load job.

    spark-submit jobs/union_and_load.py --hour 2026-11-22T12
    spark-submit jobs/union_and_load.py --hour 2026-11-22T12 --step stage --run-file run.json

(the second form is how the ``ad_union_and_load`` DAG submits each Spark
step: stage, audit, publish; the task writes ``run.json`` from the stage
task's XCom in a temporary folder of its own and reads the step's result
back from it).

Thin by design: parse arguments, read settings, hand over to
``adpipe.lakehouse.load`` (through ``adpipe load``)."""

from __future__ import annotations

import os
import sys

from adpipe.cli import main

if __name__ == "__main__":
    # Under spark-submit this process is the Spark driver: it loads itself,
    # never through a warm load driver (adpipe.lakehouse.warm).
    os.environ["ADPIPE_LOAD_WARM"] = "off"
    sys.exit(main(["load", *sys.argv[1:]]))
