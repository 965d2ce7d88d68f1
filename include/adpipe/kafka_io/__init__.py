"""Kafka clients as adpipe uses them: topic creation, client configs, a
bounded read of a whole topic (for verify and tests), and where a stream
job's committed input offsets are (its ledger group).

Every function here takes the cluster as a :class:`KafkaAccess`
(``settings.kafka``, ``region.kafka``: bootstrap and credentials, so the
same call works on a SASL/SCRAM over TLS cluster) or as a bare
``host:port[,host:port]`` string, which means a cluster without
credentials (tests, local tools).

One module per job; callers use the names below as ``kafka_io.<name>``:

* :mod:`~adpipe.kafka_io.clients` - client configs, the admin client, the
  probe groups, why a cluster refuses a client.
* :mod:`~adpipe.kafka_io.topics` - creating the pipeline's topics, their
  timestamp clock and record size limits.
* :mod:`~adpipe.kafka_io.offsets` - where partitions begin and end, by
  offset and by time.
* :mod:`~adpipe.kafka_io.groups` - a consumer group's committed offsets and
  members.
* :mod:`~adpipe.kafka_io.ledger` - a stream job's ledger group: its
  watermark, output ends and lag.
* :mod:`~adpipe.kafka_io.coordinator` - which broker coordinates a
  transactional id or a group.
* :mod:`~adpipe.kafka_io.records` - bounded reads of records back."""

from adpipe.kafka_io.clients import PROBE_GROUPS, access, admin, client_config, refusal
from adpipe.kafka_io.coordinator import (
    CONSUMER_OFFSETS,
    TRANSACTION_STATE,
    coordinator_node,
    coordinator_partition,
    java_string_hash,
)
from adpipe.kafka_io.groups import (
    GroupMember,
    committed_offsets,
    configure_group_session,
    group_commits,
    group_members,
)
from adpipe.kafka_io.ledger import (
    committed_outputs,
    committed_watermark,
    leadership_group,
    ledger_group,
    stream_commits,
    stream_lag,
    stream_lag_seconds,
)
from adpipe.kafka_io.offsets import end_offsets, first_retained, offset_bounds, offsets_for_times, start_offsets
from adpipe.kafka_io.records import (
    MissingRecordError,
    Record,
    first_timestamps,
    read_positions,
    read_topic,
    readable_partitions,
    readable_records,
)
from adpipe.kafka_io.topics import (
    BROKER_TIME,
    DEFAULT_MAX_MESSAGE_BYTES,
    TIMESTAMP_TYPE,
    check_broker_time,
    ensure_pipeline_topics,
    ensure_topics,
    fully_replicated,
    max_message_bytes,
    retention_ms,
    timestamp_type,
)

__all__ = [
    "BROKER_TIME",
    "CONSUMER_OFFSETS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PROBE_GROUPS",
    "TIMESTAMP_TYPE",
    "TRANSACTION_STATE",
    "GroupMember",
    "MissingRecordError",
    "Record",
    "access",
    "admin",
    "check_broker_time",
    "client_config",
    "committed_offsets",
    "committed_outputs",
    "committed_watermark",
    "coordinator_node",
    "coordinator_partition",
    "end_offsets",
    "ensure_pipeline_topics",
    "ensure_topics",
    "first_retained",
    "group_commits",
    "configure_group_session",
    "group_members",
    "java_string_hash",
    "leadership_group",
    "ledger_group",
    "max_message_bytes",
    "retention_ms",
    "offset_bounds",
    "offsets_for_times",
    "read_positions",
    "read_topic",
    "readable_partitions",
    "readable_records",
    "first_timestamps",
    "fully_replicated",
    "stream_lag_seconds",
    "refusal",
    "start_offsets",
    "stream_commits",
    "stream_lag",
    "timestamp_type",
]
