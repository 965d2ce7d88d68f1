"""quixstreams 3.x peer of ``make bench``, with
``processing_guarantee="exactly-once"``: the contract's validation (malformed
records to a DLQ topic with their position), dedupe by event_id in a state
store (per message key, the ad_id), tumbling 60 s windows on event time with
a grace of the watermark delay, emitted once closed (``.final()``), as the
contract's minute aggregates.

Stops after ``--messages`` input records (its final checkpoint commits the
last transaction), or on SIGTERM."""

from __future__ import annotations

from datetime import timedelta

from peer_common import Clock, aggregate, arguments, classify, dlq_value
from quixstreams import Application, message_context


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    clock = Clock()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=f"{args.job_id}-quix",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=f"{args.work}/quix-state",
        consumer_extra_config={"isolation.level": "read_committed"},
        loglevel="WARNING",
    )
    raw = app.topic(args.input, value_deserializer="bytes", key_deserializer="bytes")
    aggregates = app.topic(args.aggregates, value_serializer="json", key_serializer="bytes")
    dlq = app.topic(args.dlq, value_serializer="json", key_serializer="bytes")
    sdf = app.dataframe(raw)

    def parse(value: bytes, _key: bytes, timestamp: int, _headers: object) -> dict:
        clock.seen()
        if args.messages and clock.records >= args.messages:
            app.stop()
        verdict = classify(value, timestamp)
        if isinstance(verdict, str):
            ctx = message_context()
            return {"bad": dlq_value(verdict, ctx.topic, ctx.partition, ctx.offset)}
        return verdict

    sdf = sdf.apply(parse, metadata=True)
    sdf[sdf.apply(lambda v: "bad" in v)].apply(lambda v: v["bad"]).to_topic(dlq)

    def first_time(value: dict, state: object) -> bool:
        if state.get(value["event_id"]) is not None:  # a producer's retry
            return False
        state.set(value["event_id"], 1)
        return True

    def count(acc: list[int], value: dict) -> list[int]:
        acc[0 if value["event_type"] == "impression" else 1] += 1
        return acc

    (
        sdf[sdf.apply(lambda v: "bad" not in v)]
        .filter(first_time, stateful=True)
        .set_timestamp(lambda value, _key, _ts, _headers: value["ms"])
        .tumbling_window(timedelta(seconds=60), grace_ms=timedelta(seconds=args.lateness_s))
        .reduce(count, lambda value: count([0, 0], value))
        .final()
        .apply(
            lambda w, key, _ts, _h: aggregate(args.job_id, key.decode(), w["start"], w["value"][0], w["value"][1]),
            metadata=True,
        )
        .to_topic(aggregates)
    )
    clock.mark_ready()
    app.run()
    clock.report()


if __name__ == "__main__":
    main()
