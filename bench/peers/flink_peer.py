"""PyFlink 2.x SQL peer of ``make bench``, with an exactly-once
Kafka sink: records read as one raw string column (so a record is judged by
the contract's rules, not by Flink's lenient JSON format, which turns a
numeric event_id into a string), validated in SQL, malformed ones to a DLQ
topic with their position; valid ones into one-minute tumbling windows on
event time (watermark: event time less the delay) with distinct event_ids
per type (a producer's retry repeats the id and the time, so it lands in the
same window: a per-window distinct is the dedupe).

Bounded (``scan.bounded.mode=latest-offset``; Flink then ends the input
with the final watermark, emitting every window, and commits the last
transactions in the final checkpoint that runs after the tasks finish), or
with ``--continuous`` until SIGTERM.

Why a bounded run once "stalled, nothing committed": Flink's Kafka sink asks
for a transaction timeout of 1 h, over the broker's
``transaction.max.timeout.ms`` (15 min, Kafka's default); InitProducerId is
refused, the sink's tasks fail while initializing, and with checkpointing on
Flink's default restart strategy (exponential delay, no limit) restarts them
again and again without a word to the client. Hence
``properties.transaction.timeout.ms`` (``--transaction-timeout-ms``) and
``restart-strategy.type: none`` (a failure ends the job, the bench reports it)."""

# ruff: noqa: S608 - the SQL is this program's own; names come from the bench driver
from __future__ import annotations

import signal
import time

from peer_common import EPOCH_MS_MAX, ISO_WITH_ZONE, Clock, arguments
from pyflink.table import EnvironmentSettings, TableEnvironment


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


V = "`value`"
# A field as JSON text wrapped in an array: ["text"] for a string, [12] for a number, NULL when missing.
WRAPPED = "JSON_QUERY(" + V + ", '$.{0}' WITH CONDITIONAL ARRAY WRAPPER)"
# SQL's NULL (a missing field) must count as false, never as "unknown" (a CASE would skip the branch).
STRING_FIELD = f"COALESCE({WRAPPED} LIKE '[\"%' AND {WRAPPED} <> '[\"\"]', FALSE)"
TEXT = "JSON_VALUE(" + V + ", '$.{0}')"
T_TEXT = TEXT.format("event_time")
T_WRAPPED = WRAPPED.format("event_time")
ISO_PATTERN = ISO_WITH_ZONE.pattern.replace("(?![\\s\\S])", "$")
_SECONDS = f"COALESCE(REGEXP_EXTRACT({T_TEXT}, '^.{{16}}:([0-9]{{2}})', 1), '00')"
_FRACTION = f"REGEXP_EXTRACT({T_TEXT}, '^.{{19}}[.]([0-9]{{1,9}})', 1)"
_ZONE = f"REGEXP_EXTRACT({T_TEXT}, '(Z|[+-][0-9]{{2}}(:?[0-9]{{2}})?)$', 1)"
_OFFSET_MIN = (
    f"CASE WHEN {_ZONE} = 'Z' THEN 0 ELSE (CASE WHEN SUBSTRING({_ZONE}, 1, 1) = '-' THEN -1 ELSE 1 END) * "
    f"(CAST(SUBSTRING({_ZONE}, 2, 2) AS INT) * 60 + "
    f"COALESCE(CAST(NULLIF(REGEXP_EXTRACT({_ZONE}, '[+-][0-9]{{2}}:?([0-9]{{2}})$', 1), '') AS INT), 0)) END"
)
ISO_MS = (
    f"(UNIX_TIMESTAMP(CONCAT(SUBSTRING({T_TEXT}, 1, 10), ' ', SUBSTRING({T_TEXT}, 12, 5), ':', {_SECONDS}), "
    f"'yyyy-MM-dd HH:mm:ss') * 1000 + COALESCE(CAST(RPAD(SUBSTRING({_FRACTION}, 1, 3), 3, '0') AS BIGINT), 0) "
    f"- ({_OFFSET_MIN}) * 60000)"
)
EVENT_MS = (
    f"CASE WHEN REGEXP({T_WRAPPED}, '^\\[-?[0-9]{{1,18}}\\]$') "
    f"AND CAST({T_TEXT} AS BIGINT) BETWEEN 0 AND {EPOCH_MS_MAX} THEN CAST({T_TEXT} AS BIGINT) "
    f"WHEN {T_WRAPPED} LIKE '[\"%' AND REGEXP({T_TEXT}, {_q(ISO_PATTERN)}) THEN {ISO_MS} END"
)


def reason(max_future_skew_ms: int) -> str:
    """The contract's reject reason of the raw record, NULL when valid."""
    return (
        f"CASE WHEN {V} IS NULL OR NOT ({V} IS JSON) THEN 'not_json' "
        f"WHEN NOT ({V} IS JSON OBJECT) THEN 'not_object' "
        f"WHEN NOT {STRING_FIELD.format('event_id')} THEN 'missing_or_invalid_event_id' "
        f"WHEN NOT {STRING_FIELD.format('ad_id')} THEN 'missing_or_invalid_ad_id' "
        f"WHEN NOT COALESCE({WRAPPED.format('event_type')} IN ('[\"impression\"]', '[\"click\"]'), FALSE) "
        "THEN 'missing_or_unknown_event_type' "
        f"WHEN ({EVENT_MS}) IS NULL THEN 'missing_or_invalid_event_time' "
        # The record's timestamp to the second (Flink SQL has no epoch milliseconds of a TIMESTAMP_LTZ).
        f"WHEN ({EVENT_MS}) > UNIX_TIMESTAMP(DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss')) * 1000 + {max_future_skew_ms} "
        "THEN 'future_event_time' END"
    )


def kafka_options(args, topic: str, extra: dict[str, str]) -> str:  # noqa: ANN001
    options = {"connector": "kafka", "topic": topic, "properties.bootstrap.servers": args.bootstrap, **extra}
    return ", ".join(f"{_q(k)} = {_q(v)}" for k, v in options.items())


def sink_options(args, topic: str, suffix: str) -> dict[str, str]:  # noqa: ANN001
    options = {
        "format": "json",
        "sink.delivery-guarantee": "exactly-once",
        "sink.transactional-id-prefix": f"{args.job_id}-{suffix}",
    }
    if args.transaction_timeout_ms:
        # Under the broker's transaction.max.timeout.ms (15 min, Kafka's default): Flink's own
        # default is 1 h, which the broker refuses.
        options["properties.transaction.timeout.ms"] = str(args.transaction_timeout_ms)
    return options


def main() -> None:
    p = arguments(__doc__.splitlines()[0])
    p.add_argument("--jar", required=True, help="flink-sql-connector-kafka jar")
    p.add_argument("--continuous", action="store_true", help="unbounded, until SIGTERM")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--checkpoint-s", type=int, default=5)
    p.add_argument(
        "--transaction-timeout-ms", type=int, default=600_000, help="the sink producers' (0: Flink's default, 1 h)"
    )
    args = p.parse_args()
    clock = Clock()
    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    for key, value in {
        "pipeline.jars": f"file://{args.jar}",
        "parallelism.default": str(args.parallelism),
        "table.local-time-zone": "UTC",
        "execution.checkpointing.interval": f"{args.checkpoint_s} s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": f"file://{args.work}/flink-checkpoints",
        "rest.port": "0",
        # A failing task fails the job: with checkpointing on, Flink's default (exponential-delay
        # restarts, unbounded) retries a refused sink forever, silently, committing nothing.
        "restart-strategy.type": "none",
    }.items():
        conf.set(key, value)
    source = {
        "properties.group.id": f"{args.job_id}-flink",
        "properties.isolation.level": "read_committed",
        "scan.startup.mode": "earliest-offset",
        "format": "raw",
        "raw.charset": "UTF-8",
    }
    if not args.continuous:
        source["scan.bounded.mode"] = "latest-offset"
    skew_ms = 300_000
    t_env.execute_sql(
        f"""CREATE TABLE raw_events (
            {V} STRING,
            `partition` INT METADATA VIRTUAL,
            `offset` BIGINT METADATA VIRTUAL,
            ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,
            reason AS {reason(skew_ms)},
            event_time AS TO_TIMESTAMP_LTZ(CASE WHEN {reason(skew_ms)} IS NULL THEN {EVENT_MS} ELSE 0 END, 3),
            WATERMARK FOR event_time AS event_time - INTERVAL '{args.lateness_s}' SECOND
        ) WITH ({kafka_options(args, args.input, source)})"""
    )
    t_env.execute_sql(
        f"""CREATE TABLE aggregates (
            record_uuid STRING, ad_id STRING, window_start STRING, window_end STRING,
            impressions BIGINT, clicks BIGINT
        ) WITH ({kafka_options(args, args.aggregates, sink_options(args, args.aggregates, "agg"))},
            'key.format' = 'raw', 'key.fields' = 'ad_id', 'value.fields-include' = 'ALL')"""
    )
    t_env.execute_sql(
        f"""CREATE TABLE dlq (reason STRING, source STRING)
        WITH ({kafka_options(args, args.dlq, sink_options(args, args.dlq, "dlq"))})"""
    )
    t_env.execute_sql(
        f"""CREATE TEMPORARY VIEW valid_events AS
        SELECT {TEXT.format("event_id")} AS event_id, {TEXT.format("ad_id")} AS ad_id,
               {TEXT.format("event_type")} AS event_type, event_time
        FROM raw_events WHERE reason IS NULL"""
    )
    iso = "'yyyy-MM-dd''T''HH:mm:ss''Z'''"
    uuid_of = f"MD5(CONCAT_WS('|', {_q(args.job_id)}, ad_id, DATE_FORMAT(window_start, {iso})))"
    statements = t_env.create_statement_set()
    statements.add_insert_sql(
        f"""INSERT INTO aggregates
        SELECT CONCAT_WS('-', SUBSTRING(u, 1, 8), SUBSTRING(u, 9, 4), SUBSTRING(u, 13, 4), SUBSTRING(u, 17, 4),
                   SUBSTRING(u, 21, 12)),
               ad_id, DATE_FORMAT(window_start, {iso}), DATE_FORMAT(window_end, {iso}), impressions, clicks
        FROM (
            SELECT {uuid_of} AS u, ad_id, window_start, window_end,
                   COUNT(DISTINCT CASE WHEN event_type = 'impression' THEN event_id END) AS impressions,
                   COUNT(DISTINCT CASE WHEN event_type = 'click' THEN event_id END) AS clicks
            FROM TABLE(TUMBLE(TABLE valid_events, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
            GROUP BY ad_id, window_start, window_end
        )"""
    )
    statements.add_insert_sql(
        "INSERT INTO dlq SELECT reason, CONCAT_WS('/', "
        f"{_q(args.input)}, CAST(`partition` AS STRING), CAST(`offset` AS STRING)) "
        "FROM raw_events WHERE reason IS NOT NULL"
    )
    clock.mark_ready()
    clock.seen(0)  # Flink reports no first record: processing is from the job's submission
    result = statements.execute()
    job = result.get_job_client()
    if args.continuous:
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        while not stop:
            time.sleep(0.5)
        job.cancel().result()
    else:
        result.wait()
    clock.records = args.messages
    clock.report(job_id=str(job.get_job_id()))


if __name__ == "__main__":
    main()
