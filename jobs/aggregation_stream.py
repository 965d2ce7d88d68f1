"""spark-submit entry point of the aggregation stream job.

    spark-submit jobs/aggregation_stream.py [--available-now]

Thin by design: parse arguments, read settings, hand over to
``adpipe.stream.run`` (which builds the one SparkSession)."""

from __future__ import annotations

import argparse
import logging
import sys

from adpipe import stream
from adpipe.faults import FaultPlan
from adpipe.settings import load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="adpipe aggregation stream job (exactly-once to Kafka)")
    parser.add_argument("--available-now", action="store_true", help="process what is there now, then stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stream.run(load_settings(), available_now=args.available_now, fault=FaultPlan.from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
