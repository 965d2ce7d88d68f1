"""The one place that reads configuration: a frozen, typed object built from
the environment. Every entry point calls :func:`load_settings` once and passes
the result down; nothing else reads ``os.environ`` for adpipe settings.

Which variables there are, their defaults and what each is for live here
(the :class:`Settings` fields and :func:`load_settings`); how one value is
read and checked lives in :mod:`adpipe.setting_values`, and how a client
reaches Kafka (topics, credentials, regions) in :mod:`adpipe.kafka_access`.
Their names are importable from here too, as they always were."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from adpipe.alert_settings import AlertSettings, alert_settings
from adpipe.kafka_access import (
    KAFKA_SECURITY,
    SCRAM_MECHANISM,
    KafkaAccess,
    KafkaCredentials,
    Region,
    Topics,
    kafka_credentials,
    local_kafka_ca_file,
    local_kafka_password_file,
    regions_of,
)
from adpipe.setting_values import (
    HOST_PORT,
    SettingsError,
    above,
    broker_properties,
    budget,
    choice,
    client_networks,
    connect_urls,
    integer,
    jvm_memory,
    local_folder,
    money,
    port,
    share,
    spark_task_slots,
    uri,
    utc_time,
)

__all__ = [
    "BUDGET_PERIODS",
    "TABLES_POOL",
    "AirflowRails",
    "AlertSettings",
    "KAFKA_SECURITY",
    "PROJECT_ROOT",
    "SCRAM_MECHANISM",
    "KafkaAccess",
    "KafkaCredentials",
    "Region",
    "Settings",
    "SettingsError",
    "Topics",
    "isolated_env",
    "load_settings",
    "local_kafka_ca_file",
    "local_kafka_password_file",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


# What ADPIPE_BUDGET_PERIOD may be (adpipe.budget.money.period_of).
BUDGET_PERIODS = ("day", "hour", "month", "total")


def _one_of(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    """``env[name]``, one of ``choices``; the first when unset or empty."""
    value = env.get(name) or choices[0]
    if value not in choices:
        raise SettingsError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def _statsd_address(env: dict[str, str]) -> str:
    """``ADPIPE_AIRFLOW_STATSD``: host:port, or ``off``."""
    raw = (env.get("ADPIPE_AIRFLOW_STATSD") or Settings.airflow_statsd).strip()
    if raw.lower() == "off":
        return ""
    if not HOST_PORT.match(raw):
        raise SettingsError(f"ADPIPE_AIRFLOW_STATSD={raw!r} must be host:port or off")
    return raw


# The Airflow pool the Spark steps that write the ads tables share (the
# load's stage, validate and publish, the maintenance's OPTIMIZE and VACUUM):
# one slot, so an OPTIMIZE never races a MERGE. Made where Airflow is set up
# (adpipe.local.airflow, docker-compose's airflow-init).
TABLES_POOL = "adpipe_tables"


@dataclass(frozen=True)
class AirflowRails:
    """Airflow's own safety rails on the DAGs (docs/operations.md): each
    task's ``execution_timeout`` (a load step, ADPIPE_LOAD_STEP_TIMEOUT_S; a
    stream DAG task, ADPIPE_STREAM_TASK_TIMEOUT_S; a maintenance task,
    ADPIPE_MAINTENANCE_TIMEOUT_S) and the load DAG's ``dagrun_timeout``
    (ADPIPE_LOAD_RUN_TIMEOUT_S: more than the wait for the hour to close),
    and how long a failed idempotent load task waits before its one retry
    (ADPIPE_LOAD_RETRY_DELAY_S: a worker lost mid-step is retried on
    another after it). Read where the DAG files are parsed."""

    load_step_timeout_s: int = 3600
    load_retry_delay_s: int = 300
    load_run_timeout_s: int = 8 * 3600
    stream_task_timeout_s: int = 600
    maintenance_timeout_s: int = 4800


class _Locations:
    """Where a deployment keeps its state and how its local databases are
    reached, derived from a few :class:`Settings` fields (declared here for
    the type checker; the dataclass below holds them). A base of its own so
    that ``Settings`` reads as the list of what is configured."""

    home: Path
    checkpoint_base_uri: str
    warehouse_base_uri: str
    job_id: str
    pg_host: str
    pg_port: int
    pg_user: str
    pg_password: str

    @property
    def checkpoint_uri(self) -> str:
        """This job's checkpoint: ``<ADPIPE_CHECKPOINT_URI>/<job id>``, any URI
        Spark writes (default: under ADPIPE_HOME). Written as Hadoop reads
        it: a path is not percent-encoded (``file:///tmp/my checkpoints``)."""
        base = self.checkpoint_base_uri or f"file://{self.home / 'checkpoints'}"
        return f"{base.rstrip('/')}/{self.job_id}"

    @property
    def checkpoint_dir(self) -> Path:
        """The checkpoint as a local folder (a ``file:`` URI only)."""
        return local_folder(self.checkpoint_uri, "the checkpoint")

    @property
    def warehouse_uri(self) -> str:
        """Spark's warehouse: ADPIPE_WAREHOUSE_URI, default under ADPIPE_HOME."""
        return self.warehouse_base_uri.rstrip("/") or f"file://{self.home / 'warehouse'}"

    @property
    def warehouse_dir(self) -> Path:
        """The warehouse as a local folder (a ``file:`` URI only)."""
        return local_folder(self.warehouse_uri, "the warehouse")

    @property
    def metrics_dir(self) -> Path:
        """The load's metrics as files for node_exporter's textfile collector."""
        return self.home / "metrics"

    @property
    def log_dir(self) -> Path:
        """The JVMs' log files (ADPIPE_JVM_LOGS=file) and the demo's own log."""
        return self.home / "logs"

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def pg_dir(self) -> Path:
        return self.home / "postgres"

    def pg_url(self, database: str, redacted: bool = False) -> str:
        """SQLAlchemy URL of a database on the local PostgreSQL; ``redacted``:
        the password as ``***``, for anything printed or logged."""
        password = "***" if redacted else self.pg_password
        return f"postgresql+psycopg2://{self.pg_user}:{password}@{self.pg_host}:{self.pg_port}/{database}"

    def jdbc_url(self, database: str) -> str:
        return f"jdbc:postgresql://{self.pg_host}:{self.pg_port}/{database}"

    @property
    def jar_cache(self) -> Path:
        return PROJECT_ROOT / ".cache" / "jvm"

    @property
    def data_docs_assets(self) -> Path:
        """The Data Docs' stylesheets and scripts (make data-docs-assets)."""
        return PROJECT_ROOT / ".cache" / "data-docs" / "node_modules"


@dataclass(frozen=True)
class Settings(_Locations):
    """Everything adpipe is configured by. Build with :func:`load_settings`."""

    home: Path
    kafka_bootstrap: str = "127.0.0.1:9092"
    # Who this process is on Kafka (ADPIPE_KAFKA_SECURITY, _USERNAME,
    # _PASSWORD_FILE or _PASSWORD, _CA_FILE); clients use self.kafka.
    kafka_credentials: KafkaCredentials = field(default_factory=KafkaCredentials)
    kafka_controller_port: int = 9093
    # Lines added to `adpipe kafka up`'s server.properties (ADPIPE_KAFKA_BROKER_PROPERTIES).
    kafka_broker_properties: tuple[str, ...] = ()
    spark_master: str = "local[2]"
    jvm_options: tuple[str, ...] = ()  # for every JVM adpipe starts (Spark, Kafka, HDFS)
    spark_jit: str = "auto"  # ADPIPE_SPARK_JIT: quick, full or auto (adpipe.spark.jit_options)
    spark_gc: str = "auto"  # ADPIPE_SPARK_GC: serial, default or auto (adpipe.spark.gc_options)
    # The drivers' heap (the stream's own: 1g peaks lower, runs slower), log level, the load's Spark Connect server.
    spark_driver_memory: str = "2g"
    stream_driver_memory: str = "2g"
    spark_log_level: str = "WARN"
    spark_connect: str = ""
    # Where the Spark driver's own log4j lines go (ADPIPE_JVM_LOGS): "file", a file per application
    # under log_dir, only errors also on stderr, so that a command's output is its own; "console",
    # Spark's default, all of it on stderr (`adpipe -v` sets it, for itself and its children).
    jvm_logs: str = "file"
    # On a spark:// master (adpipe.spark): each executor's heap, the cores an
    # application takes at most (0: all the cluster offers; two applications
    # at once, e.g. the stream job and a load, need a cap each) and the
    # address executors reach the driver at (loopback for the local cluster;
    # this host's address on a cluster of several machines).
    spark_executor_memory: str = "1g"
    spark_cores_max: int = 0
    spark_driver_host: str = "127.0.0.1"
    # The local Spark standalone cluster (`adpipe spark up`,
    # adpipe.local.spark_cluster): the master's RPC and web UI ports (worker k's
    # UI listens on the master's UI port + k; Airflow has 8080), and what each
    # worker offers to executors.
    spark_master_port: int = 7077
    spark_master_ui_port: int = 8091
    spark_worker_cores: int = 1
    spark_worker_memory: str = "2g"
    hdfs_port: int = 9820  # the local HDFS's NameNode (adpipe.local.hdfs; +1..+4 its other ports)
    # A URL that may hold a password: kept out of repr() (as the other
    # secrets below: pg_password, alert_webhook, the Kafka password).
    budget_db: str = field(default="", repr=False)
    topics: Topics = field(default_factory=Topics)
    topic_partitions: int = 4
    # Fixed for the life of a checkpoint: Spark cannot change the number of
    # state partitions across restarts of one query. Default: one per task
    # slot (local[2]: 2), 4 on a cluster without ADPIPE_SPARK_CORES_MAX.
    shuffle_partitions: int = 4
    # The watermark: the slowest partition's highest event time (of those with
    # records waiting) less this delay; =off: of all partitions (Spark's rule).
    watermark_delay_s: int = 30
    watermark_alignment: bool = True
    # How long after its close (event time) late events still revise a window
    # (docs/operations.md); later ones go to the late topic.
    allowed_lateness_s: int = 300
    trigger_interval_s: int = 5
    # Records per micro-batch at most (0: no cap), so a backlog after an
    # outage becomes many bounded batches, never one giant one that outlives
    # the transaction timeout or the driver's memory. Measured
    # (docs/performance.md, "Bounded batches"): 500,000 cuts most of the
    # per-batch cost of smaller caps (state stores committed, planning, one
    # transaction per batch) and keeps a batch of a backlog near 4 s here
    # and its transaction far below the transaction timeout.
    max_offsets_per_trigger: int = 500_000
    # An event_time more than this after its Kafka record's own timestamp is
    # malformed (future_event_time): a clock far ahead never moves the watermark.
    max_future_skew_s: int = 300
    # How long the stream job remembers an event_id, in event time: until
    # the watermark passes the end of the event's minute plus this. Within
    # it a copy is a repeat (same event time) or a conflicting duplicate
    # (another); after it, a copy is new again (adpipe.spark.EventIds).
    late_dedupe_retention_s: int = 86_400
    # The quality gate fails an hour whose late events are more than this
    # share of its valid events (a stream far behind, a producer replaying).
    max_late_share: float = 0.01
    # The gate checks an hour of at most this many raw events plus aggregate
    # rows in pandas (GE's pandas engine: seconds less than its Spark engine's
    # per hour, 18 s less for a 10,000-ad hour, for about 0.7 GB more in the
    # driver's Python); a bigger hour in Spark. 0: always Spark.
    gate_pandas_max_rows: int = 2_000_000
    # How long a load waits for the stream's last batch's output to become
    # readable (its transaction markers) before it fails, retriably.
    load_output_wait_s: int = 60
    # Where checkpoints live, as a URI Spark writes (file://, hdfs://, s3a://);
    # empty: ADPIPE_HOME/checkpoints. Each job's is <this>/<job id>.
    checkpoint_base_uri: str = ""
    # Where the Delta tables live (Spark's warehouse), a URI as above;
    # empty: ADPIPE_HOME/warehouse. One warehouse per metastore database:
    # a second metastore would find the first one's tables in the way.
    warehouse_base_uri: str = ""
    # Which stream job instance this is (one per region). It names the
    # checkpoint, the transactional.id and the record_uuid namespace.
    job_id: str = "region-local"
    # Above the longest batch's produce+commit plus a restart (see tx_sink).
    transaction_timeout_ms: int = 120_000
    # The local PostgreSQL of the embedded default (Hive metastore, budget
    # database, Airflow metadata): loopback only, started by `adpipe pg up`.
    pg_host: str = "127.0.0.1"
    pg_port: int = 5433
    pg_user: str = "adpipe"
    pg_password: str = field(default="adpipe", repr=False)  # loopback-only local default
    pg_clients: tuple[str, ...] = ("samenet",)  # who logs in to `adpipe pg up` off loopback (pg_hba.conf)
    # The budget service (adpipe.budget.service): its consumer group, the
    # records per database transaction, the budget period (from each
    # aggregate's window_start: day, hour, month or total), the default price
    # row seeded into an empty pricing table (micro-units; budget None =
    # unlimited) and the group session timeout (how fast a dead instance's
    # partitions move to the others).
    budget_group: str = "adpipe-budget"
    budget_batch_size: int = 2000
    budget_period: str = "day"
    budget_default_cpm_micros: int = 2_000_000
    budget_default_cpc_micros: int = 500_000
    budget_default_budget_micros: int | None = 100_000_000
    # The consumer group protocol (ADPIPE_BUDGET_GROUP_PROTOCOL): "consumer",
    # KIP-848's, whose rebalances are incremental (the survivors keep
    # consuming) and whose session timeout is the group's own config, set by
    # the service at start; or "classic" (eager, range-assigned). A killed
    # instance's partitions move after the session timeout.
    budget_group_protocol: str = "consumer"
    budget_session_timeout_ms: int = 6_000
    # Database faults (adpipe.budget.outage): how long a database outage is
    # waited out (consumption paused, the consumer still polling within
    # max.poll.interval.ms) before the service gives up; the connect and
    # statement timeouts of every budget database call.
    budget_db_outage_s: int = 600
    budget_max_poll_interval_ms: int = 300_000
    budget_db_connect_timeout_s: int = 10
    budget_db_statement_timeout_ms: int = 30_000
    # How often the publisher thread publishes the outbox and settles pauses
    # against changed budgets; `budget prune` keeps ledger rows this many
    # hours beyond the aggregates topic's retention.
    budget_publish_interval_s: float = 5.0
    budget_ledger_margin_h: int = 168
    # "postgres": a Hive metastore in PostgreSQL that several Spark
    # applications share; "derby": Spark's embedded one, one JVM at a time.
    metastore: str = "postgres"
    # The PostgreSQL database of the Hive metastore (one per deployment, or
    # per test home: each its own "ads" tables).
    metastore_database: str = "adpipe_metastore"
    # The regions Union & Load reads (ADPIPE_REGIONS); empty = this one.
    extra_regions: tuple[Region, ...] = ()
    # Airflow (adpipe.orchestration). Alerts go to a JSON-lines file under
    # home/alerts and, when set, are POSTed to this webhook.
    alert_webhook: str = field(default="", repr=False)  # a webhook URL often holds its token
    alert_webhook_timeout_s: int = 5
    alerts: AlertSettings = field(default_factory=AlertSettings)  # e-mail, Slack, the publish deadline
    # Stream supervision: alert when the stream was restarted more than
    # stream_max_restarts times within stream_restart_window_s, or when its
    # input lag (raw records not yet committed by the job) passes
    # stream_max_lag. A live process with lag and no finished batch for
    # stream_stall_s is stalled and gets restarted.
    stream_max_restarts: int = 3
    stream_restart_window_s: int = 3600
    stream_max_lag: int = 100_000
    stream_stall_s: int = 300
    # The stream drivers' session in their leadership group: a standby takes
    # over from an active driver that has not reached the brokers for this
    # long (dead, frozen, cut off). 6: the brokers' smallest by default.
    stream_lease_s: int = 6
    # The stream DAG keeps a warm standby driver beside the active one.
    stream_standby: bool = False
    # First hour the hourly Union & Load DAG loads, catching up from there;
    # unset: the hour before the DAG is first unpaused, then each hour after.
    load_start: datetime | None = None
    # How long the load DAG waits for an hour to close before failing.
    load_wait_timeout_s: int = 6 * 3600
    # The DAGs' timeouts (AirflowRails).
    rails: AirflowRails = field(default_factory=AirflowRails)
    # How the load DAG runs its Spark steps: "warm" (in the home's warm load
    # driver, adpipe.lakehouse.warm, started by the first step if none runs:
    # LocalExecutor, as make airflow and docker compose run Airflow),
    # "spark-submit" (SparkSubmitOperator, connection adpipe_spark: an
    # executor whose tasks land on other hosts) or "in-process".
    load_submit: str = "warm"
    # Whether load, validate, maintain and verify --hour run in the warm load
    # driver: "auto" (when one runs with this session's settings), "on" (and
    # start one when none runs) or "off" (always in their own process).
    load_warm: str = "auto"
    # A warm load driver exits after this long without a request (above an
    # hour: an hourly load keeps it warm).
    load_warm_idle_s: int = 7200
    # The daily table maintenance's VACUUM keeps files that any table version
    # of the last this-many hours references (time travel, and readers or a
    # load that began before an OPTIMIZE). Set on each table as its
    # delta.deletedFileRetentionDuration, which Delta 4's VACUUM applies. At
    # least 7 days (Delta's default): a shorter one is refused here.
    vacuum_retention_h: int = 168
    # Port of the local Airflow UI / API server (make airflow).
    airflow_port: int = 8080
    # Prometheus metrics (adpipe.metrics): the stream job, the budget service
    # and a load each serve /metrics on metrics_host at a port of their own,
    # so the three on one host never collide (0: not served; a second
    # instance of one part on the host needs a port of its own).
    metrics_host: str = "127.0.0.1"
    stream_metrics_port: int = 9461
    budget_metrics_port: int = 9462
    load_metrics_port: int = 9463
    # Where Airflow sends its own metrics as StatsD (host:port, a
    # statsd_exporter for Prometheus); "" (ADPIPE_AIRFLOW_STATSD=off): none.
    airflow_statsd: str = "127.0.0.1:9125"

    @property
    def lateness_ms(self) -> int:
        """How far behind the highest event time a window's counts become
        final: the watermark delay plus the allowed lateness (a window ending
        at t can change until the watermark passes t + allowed lateness)."""
        return (self.watermark_delay_s + self.allowed_lateness_s) * 1000

    @property
    def max_future_skew_ms(self) -> int:
        return self.max_future_skew_s * 1000

    @property
    def budget_incremental(self) -> bool:
        """Whether the budget group is on the consumer protocol (KIP-848):
        incremental assignments, the session timeout a group config."""
        return self.budget_group_protocol == "consumer"

    @property
    def budget_heartbeat_interval_ms(self) -> int:
        """How often a budget instance tells its group it lives: a fifth of
        the session (at least 1 s). Under the consumer protocol it is also
        how soon a survivor hears of the partitions it takes over."""
        return max(1000, self.budget_session_timeout_ms // 5)

    @property
    def kafka(self) -> KafkaAccess:
        """This process's Kafka cluster and credentials, for every client."""
        return KafkaAccess(self.kafka_bootstrap, self.kafka_credentials)

    @property
    def regions(self) -> tuple[Region, ...]:
        """Every region to union: the configured ones, else this job's own."""
        return self.extra_regions or (Region(self.job_id, self.kafka_bootstrap, self.topics, self.kafka_credentials),)

    def for_region(self, region: Region) -> Settings:
        """These settings as that region's stream job has them."""
        return replace(
            self,
            job_id=region.job_id,
            kafka_bootstrap=region.kafka_bootstrap,
            topics=region.topics,
            kafka_credentials=region.kafka_credentials,
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def isolated_env(prefix: str) -> dict[str, str]:
    """The variables that give one run (a demo, a chaos run, a test) topics
    and a job id of its own, all named ``<prefix>-...``: runs side by side on
    one broker never see each other's records or ledger."""
    return {
        "ADPIPE_TOPIC_EVENTS": f"{prefix}-{Topics.events}",
        "ADPIPE_TOPIC_AGGREGATES": f"{prefix}-{Topics.aggregates}",
        "ADPIPE_TOPIC_DLQ": f"{prefix}-{Topics.dlq}",
        "ADPIPE_TOPIC_LATE": f"{prefix}-{Topics.late}",
        "ADPIPE_TOPIC_BUDGET_EVENTS": f"{prefix}-{Topics.budget_events}",
        "ADPIPE_JOB_ID": prefix,
    }


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Read ``ADPIPE_*`` variables; every one has a working local default."""
    env = dict(os.environ if env is None else env)
    home = Path(env.get("ADPIPE_HOME") or PROJECT_ROOT / ".adpipe").expanduser().resolve()
    topics = Topics(
        events=env.get("ADPIPE_TOPIC_EVENTS", Topics.events),
        aggregates=env.get("ADPIPE_TOPIC_AGGREGATES", Topics.aggregates),
        dlq=env.get("ADPIPE_TOPIC_DLQ", Topics.dlq),
        late=env.get("ADPIPE_TOPIC_LATE", Topics.late),
        budget_events=env.get("ADPIPE_TOPIC_BUDGET_EVENTS", Topics.budget_events),
    )
    bootstrap = env.get("ADPIPE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    master, cores_max = env.get("ADPIPE_SPARK_MASTER", "local[2]"), integer(env, "ADPIPE_SPARK_CORES_MAX", 0)
    slots = spark_task_slots(master, cores_max)
    if not all(HOST_PORT.match(part.strip()) for part in bootstrap.split(",")):
        raise SettingsError(f"ADPIPE_KAFKA_BOOTSTRAP={bootstrap!r} must be host:port[,host:port]")
    credentials = kafka_credentials(
        home,
        env.get("ADPIPE_KAFKA_SECURITY") or "plaintext",
        env.get("ADPIPE_KAFKA_USERNAME", ""),
        env.get("ADPIPE_KAFKA_PASSWORD", ""),
        env.get("ADPIPE_KAFKA_PASSWORD_FILE", ""),
        env.get("ADPIPE_KAFKA_CA_FILE", ""),
    )
    metastore = _one_of(env, "ADPIPE_METASTORE", ("postgres", "derby"))
    wait_s = integer(env, "ADPIPE_LOAD_WAIT_TIMEOUT_S", Settings.load_wait_timeout_s, 1)
    metastore_database = env.get("ADPIPE_METASTORE_DATABASE", Settings.metastore_database)
    delay_s = integer(env, "ADPIPE_WATERMARK_DELAY_S", Settings.watermark_delay_s)
    lateness_s = integer(env, "ADPIPE_ALLOWED_LATENESS_S", Settings.allowed_lateness_s)
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", metastore_database):
        raise SettingsError(
            f"ADPIPE_METASTORE_DATABASE={metastore_database!r} must be a lower-case PostgreSQL name (a-z, 0-9, _)"
        )
    return Settings(
        home=home,
        kafka_bootstrap=bootstrap,
        kafka_credentials=credentials,
        kafka_controller_port=integer(env, "ADPIPE_KAFKA_CONTROLLER_PORT", Settings.kafka_controller_port, 1),
        kafka_broker_properties=broker_properties(env, "ADPIPE_KAFKA_BROKER_PROPERTIES"),
        spark_master=master,
        jvm_options=tuple(shlex.split(env.get("ADPIPE_JVM_OPTIONS", ""))),
        spark_jit=choice(env, "ADPIPE_SPARK_JIT", ("auto", "quick", "full")),
        spark_gc=choice(env, "ADPIPE_SPARK_GC", ("auto", "serial", "default")),
        spark_driver_memory=jvm_memory(env, "ADPIPE_SPARK_DRIVER_MEMORY", Settings.spark_driver_memory),
        stream_driver_memory=jvm_memory(env, "ADPIPE_STREAM_DRIVER_MEMORY", Settings.stream_driver_memory),
        spark_log_level=(env.get("ADPIPE_SPARK_LOG_LEVEL") or "WARN").upper(),
        spark_connect=connect_urls(env, "ADPIPE_SPARK_CONNECT"),
        jvm_logs=choice(env, "ADPIPE_JVM_LOGS", ("file", "console")),
        spark_executor_memory=jvm_memory(env, "ADPIPE_SPARK_EXECUTOR_MEMORY", Settings.spark_executor_memory),
        spark_cores_max=cores_max,
        spark_driver_host=env.get("ADPIPE_SPARK_DRIVER_HOST") or "127.0.0.1",
        spark_master_port=integer(env, "ADPIPE_SPARK_MASTER_PORT", Settings.spark_master_port, 1),
        spark_master_ui_port=integer(env, "ADPIPE_SPARK_MASTER_UI_PORT", Settings.spark_master_ui_port, 1),
        spark_worker_cores=integer(env, "ADPIPE_SPARK_WORKER_CORES", Settings.spark_worker_cores, 1),
        spark_worker_memory=jvm_memory(env, "ADPIPE_SPARK_WORKER_MEMORY", Settings.spark_worker_memory),
        hdfs_port=integer(env, "ADPIPE_HDFS_PORT", Settings.hdfs_port, 1),
        budget_db=env.get("ADPIPE_BUDGET_DB", f"sqlite:///{home / 'budget.db'}"),
        topics=topics,
        topic_partitions=integer(env, "ADPIPE_TOPIC_PARTITIONS", Settings.topic_partitions, 1),
        shuffle_partitions=integer(env, "ADPIPE_SHUFFLE_PARTITIONS", slots or Settings.shuffle_partitions, 1),
        watermark_delay_s=delay_s,
        watermark_alignment=choice(env, "ADPIPE_WATERMARK_ALIGNMENT", ("on", "off")) == "on",
        allowed_lateness_s=lateness_s,
        trigger_interval_s=integer(env, "ADPIPE_TRIGGER_INTERVAL_S", Settings.trigger_interval_s, 1),
        max_offsets_per_trigger=integer(env, "ADPIPE_MAX_OFFSETS_PER_TRIGGER", Settings.max_offsets_per_trigger),
        max_future_skew_s=integer(env, "ADPIPE_MAX_FUTURE_SKEW_S", Settings.max_future_skew_s),
        late_dedupe_retention_s=integer(env, "ADPIPE_LATE_DEDUPE_RETENTION_S", Settings.late_dedupe_retention_s),
        max_late_share=share(env, "ADPIPE_MAX_LATE_SHARE", Settings.max_late_share),
        gate_pandas_max_rows=integer(env, "ADPIPE_GATE_PANDAS_MAX_ROWS", Settings.gate_pandas_max_rows),
        load_output_wait_s=integer(env, "ADPIPE_LOAD_OUTPUT_WAIT_S", Settings.load_output_wait_s, 0),
        checkpoint_base_uri=uri(env, "ADPIPE_CHECKPOINT_URI"),
        warehouse_base_uri=uri(env, "ADPIPE_WAREHOUSE_URI"),
        job_id=env.get("ADPIPE_JOB_ID", "region-local"),
        transaction_timeout_ms=integer(env, "ADPIPE_TRANSACTION_TIMEOUT_MS", Settings.transaction_timeout_ms, 1000),
        pg_host=env.get("ADPIPE_PG_HOST", "127.0.0.1"),
        pg_port=integer(env, "ADPIPE_PG_PORT", Settings.pg_port, 1),
        pg_clients=client_networks(env, "ADPIPE_PG_CLIENTS", Settings.pg_clients),
        pg_user=env.get("ADPIPE_PG_USER", "adpipe"),
        pg_password=env.get("ADPIPE_PG_PASSWORD", "adpipe"),
        budget_group=env.get("ADPIPE_BUDGET_GROUP") or "adpipe-budget",
        budget_batch_size=integer(env, "ADPIPE_BUDGET_BATCH_SIZE", Settings.budget_batch_size, 1),
        budget_period=_one_of(env, "ADPIPE_BUDGET_PERIOD", BUDGET_PERIODS),
        budget_default_cpm_micros=money(env, "ADPIPE_BUDGET_DEFAULT_CPM", "2.00"),
        budget_default_cpc_micros=money(env, "ADPIPE_BUDGET_DEFAULT_CPC", "0.50"),
        budget_default_budget_micros=budget(env, "ADPIPE_BUDGET_DEFAULT_BUDGET", "100.00"),
        budget_group_protocol=_one_of(env, "ADPIPE_BUDGET_GROUP_PROTOCOL", ("consumer", "classic")),
        budget_session_timeout_ms=integer(
            env, "ADPIPE_BUDGET_SESSION_TIMEOUT_MS", Settings.budget_session_timeout_ms, 6000
        ),
        budget_db_outage_s=integer(env, "ADPIPE_BUDGET_DB_OUTAGE_S", Settings.budget_db_outage_s, 0),
        budget_max_poll_interval_ms=integer(
            env, "ADPIPE_BUDGET_MAX_POLL_INTERVAL_MS", Settings.budget_max_poll_interval_ms, 1000
        ),
        budget_db_connect_timeout_s=integer(
            env, "ADPIPE_BUDGET_DB_CONNECT_TIMEOUT_S", Settings.budget_db_connect_timeout_s, 1
        ),
        budget_db_statement_timeout_ms=integer(
            env, "ADPIPE_BUDGET_DB_STATEMENT_TIMEOUT_MS", Settings.budget_db_statement_timeout_ms, 100
        ),
        budget_publish_interval_s=integer(env, "ADPIPE_BUDGET_PUBLISH_INTERVAL_MS", 5000, 100) / 1000,
        budget_ledger_margin_h=integer(env, "ADPIPE_BUDGET_LEDGER_MARGIN_H", Settings.budget_ledger_margin_h, 0),
        metastore=metastore,
        metastore_database=metastore_database,
        extra_regions=regions_of(env.get("ADPIPE_REGIONS", ""), bootstrap, topics, credentials, home),
        alert_webhook=env.get("ADPIPE_ALERT_WEBHOOK", ""),
        alert_webhook_timeout_s=integer(env, "ADPIPE_ALERT_WEBHOOK_TIMEOUT_S", Settings.alert_webhook_timeout_s, 1),
        alerts=alert_settings(env, delay_s, lateness_s),
        stream_max_restarts=integer(env, "ADPIPE_STREAM_MAX_RESTARTS", Settings.stream_max_restarts),
        stream_restart_window_s=integer(env, "ADPIPE_STREAM_RESTART_WINDOW_S", Settings.stream_restart_window_s, 1),
        stream_max_lag=integer(env, "ADPIPE_STREAM_MAX_LAG", Settings.stream_max_lag),
        stream_stall_s=integer(env, "ADPIPE_STREAM_STALL_S", Settings.stream_stall_s, 1),
        stream_lease_s=integer(env, "ADPIPE_STREAM_LEASE_S", Settings.stream_lease_s, 2),
        stream_standby=choice(env, "ADPIPE_STREAM_STANDBY", ("off", "on")) == "on",
        load_start=utc_time(env, "ADPIPE_LOAD_START", Settings.load_start),
        load_wait_timeout_s=wait_s,
        rails=AirflowRails(
            load_step_timeout_s=integer(env, "ADPIPE_LOAD_STEP_TIMEOUT_S", AirflowRails.load_step_timeout_s, 1),
            load_run_timeout_s=above(env, "ADPIPE_LOAD_RUN_TIMEOUT_S", AirflowRails.load_run_timeout_s, wait_s),
            load_retry_delay_s=integer(env, "ADPIPE_LOAD_RETRY_DELAY_S", AirflowRails.load_retry_delay_s, 1),
            stream_task_timeout_s=integer(env, "ADPIPE_STREAM_TASK_TIMEOUT_S", AirflowRails.stream_task_timeout_s, 1),
            maintenance_timeout_s=integer(env, "ADPIPE_MAINTENANCE_TIMEOUT_S", AirflowRails.maintenance_timeout_s, 1),
        ),
        load_submit=choice(env, "ADPIPE_LOAD_SUBMIT", ("warm", "spark-submit", "in-process")),
        load_warm=choice(env, "ADPIPE_LOAD_WARM", ("auto", "on", "off")),
        load_warm_idle_s=integer(env, "ADPIPE_LOAD_WARM_IDLE_S", Settings.load_warm_idle_s, 10),
        vacuum_retention_h=integer(env, "ADPIPE_VACUUM_RETENTION_H", Settings.vacuum_retention_h, 168),
        airflow_port=integer(env, "ADPIPE_AIRFLOW_PORT", Settings.airflow_port, 1),
        metrics_host=env.get("ADPIPE_METRICS_HOST") or Settings.metrics_host,
        stream_metrics_port=port(env, "ADPIPE_STREAM_METRICS_PORT", Settings.stream_metrics_port),
        budget_metrics_port=port(env, "ADPIPE_BUDGET_METRICS_PORT", Settings.budget_metrics_port),
        load_metrics_port=port(env, "ADPIPE_LOAD_METRICS_PORT", Settings.load_metrics_port),
        airflow_statsd=_statsd_address(env),
    )
