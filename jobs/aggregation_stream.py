"""spark-submit entry point of the aggregation stream job.

    spark-submit jobs/aggregation_stream.py [--available-now]

Thin by design: the same as ``adpipe stream`` (adpipe.stream.cli), which
reads the settings and hands over to ``adpipe.stream.driver.run`` (which builds
the one SparkSession); exit 4 when fenced by a successor."""

from __future__ import annotations

import sys

from adpipe.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
