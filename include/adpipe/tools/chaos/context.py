"""Where one run lives: its id, its folder under ``$ADPIPE_HOME/chaos``, the
environment of its children (its own topics, job id and databases on the
local cluster) and the settings they read from it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from adpipe.local import kafka_broker
from adpipe.settings import Settings, isolated_env, load_settings


@dataclass
class RunContext:
    base: Settings  # the cluster's: its brokers, workers and PostgreSQL
    run_id: str
    home: Path
    logs: Path
    env: dict[str, str]  # the children's
    settings: Settings  # the run's, read from ``env``

    @classmethod
    def create(cls, base: Settings) -> RunContext:
        run_id = time.strftime("%Y%m%d%H%M%S", time.gmtime())
        home = base.home / "chaos" / run_id
        logs = home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = run_env(base, run_id, home)
        return cls(base, run_id, home, logs, env, load_settings(env))

    def on_cluster(self, base: Settings, extra: dict[str, str]) -> RunContext:
        """The same run on another cluster (``--hosts``: the services
        host's), ``extra`` over its children's environment."""
        env = {**run_env(base, self.run_id, self.home), **extra}
        return RunContext(base, self.run_id, self.home, self.logs, env, load_settings(env))

    def databases(self) -> tuple[str, str]:
        """The run's budget and metastore databases."""
        return db_name(self.run_id, "budget"), db_name(self.run_id, "ms")


def run_env(settings: Settings, run_id: str, run_home: Path) -> dict[str, str]:
    """The children's environment: this run's topics, job id, checkpoint and
    databases on the local cluster, with faults in mind (a short transaction
    timeout, so a stopped driver's open transaction is aborted within the run)."""
    prefix = f"chaos-{run_id}"
    return {
        **os.environ,
        "ADPIPE_HOME": str(run_home),
        "ADPIPE_KAFKA_BOOTSTRAP": kafka_broker.cluster_bootstrap(settings),
        **isolated_env(prefix),
        # Named, not left to ADPIPE_HOME: on hosts each part has a home of its own.
        "ADPIPE_CHECKPOINT_URI": f"file://{run_home / 'checkpoints'}",
        "ADPIPE_WAREHOUSE_URI": f"file://{run_home / 'warehouse'}",
        "ADPIPE_BUDGET_DB": settings.pg_url(db_name(run_id, "budget")),
        "ADPIPE_BUDGET_GROUP": f"{prefix}-budget",
        "ADPIPE_METASTORE_DATABASE": db_name(run_id, "ms"),
        "ADPIPE_TRANSACTION_TIMEOUT_MS": "30000",
        "ADPIPE_TRIGGER_INTERVAL_S": "2",
        # A takeover replays the dead driver's last batch, at most this many
        # offsets. Its cold first batch took 30-74 s at 20,000 and 24-76 s at
        # 5,000 (docs/performance.md): the cold query costs, not the size.
        "ADPIPE_MAX_OFFSETS_PER_TRIGGER": "5000",
        "ADPIPE_SPARK_DRIVER_MEMORY": os.environ.get("ADPIPE_SPARK_DRIVER_MEMORY", "1g"),
        # Faults delay partitions unevenly: a late event is a correct outcome
        # (listed once in the late topic), never a reason to hold a load back.
        "ADPIPE_MAX_LATE_SHARE": "1",
        # A load kill must kill the load: each runs in a process of its own,
        # never in a warm load driver (whose client's death stops nothing).
        "ADPIPE_LOAD_WARM": "off",
    }


def db_name(run_id: str, what: str) -> str:
    return f"chaos_{run_id}_{what}".lower()
