"""The I/O floor of ``make bench``: one confluent-kafka consumer
(read_committed) that reads every record of the input topic and parses it
with ``json.loads``, nothing more. No output; its report counts the records
that were not JSON."""

from __future__ import annotations

import json

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from peer_common import Clock, arguments


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    clock = Clock()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"{args.job_id}-io-floor",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
        }
    )
    partitions = consumer.list_topics(args.input, timeout=30).topics[args.input].partitions
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING) for p in partitions])
    clock.mark_ready()
    not_json = 0
    while clock.records < args.messages:
        batch = consumer.consume(10_000, 1.0)
        if batch:
            clock.seen(0)
        for msg in batch:
            if msg.error():
                continue
            try:
                json.loads(msg.value())
            except ValueError:
                not_json += 1
            clock.records += 1
    consumer.close()
    clock.report(not_json=not_json)


if __name__ == "__main__":
    main()
