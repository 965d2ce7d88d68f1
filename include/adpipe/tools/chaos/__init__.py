"""``adpipe chaos``: the whole pipeline under random faults, then an
independent check (:mod:`adpipe.tools.chaos.check`).

One run starts the stream job, two budget service instances and hourly
Union & Load runs as real processes on the local cluster (the brokers of
``adpipe kafka up``, the PostgreSQL of ``adpipe pg up`` and, with
``ADPIPE_SPARK_MASTER=spark://``, the workers of ``adpipe spark up``), while
a producer writes at a steady rate. For ``--duration`` seconds it injects
faults drawn from a seeded schedule (``--seed`` replays one): SIGKILL of the
stream driver, of a Spark worker, of a budget instance, of a load; SIGSTOP
of the driver past the transaction timeout while a successor driver takes
over, then SIGCONT (a real zombie); SIGTERM or SIGKILL of one broker
at a time, and of the leader of the transaction-state partition that holds
the stream job's transactional id. Killed parts are restarted as a
supervisor would (a failed restart is retried with backoff, and a part
that stays down is reported in the verdict). A fault counts only when it
happened; fewer than planned make the run SHORT. Then it drains (every window closed, every hour loaded)
and checks the output against the producer's own record of what it sent.

Each run has its own topics, job id, budget database and metastore
database, under ``$ADPIPE_HOME/chaos/<run id>``.

The modules, each one job:

* ``plan`` - the spec, the seeded fault schedule, the events;
* ``context`` - the run's id, folder, environment and settings;
* ``timeline`` - the fault clock, the actions due later, the record of
  the faults;
* ``parts`` - the supervised processes and their restarts;
* ``monitor`` - progress, sampled on a thread of its own;
* ``loads`` - the hourly loads;
* ``supervise`` - restarts of what died, stalls, recoveries judged;
* ``zombie`` - the stream_pause fault, from the stop to the retirement;
* ``inject`` - the other faults, and the restarts of workers and brokers;
* ``rig`` - those wired together, which ``harness`` (:class:`ChaosRun`)
  runs through the warm-up and the fault window into ``drain``, then
  ``report``;
* ``check`` - the independent check and the verdict.

The tunables stay in the module that uses them: the restart backoff in
``parts``, the pause's margins in ``zombie``, the stall time in
``supervise``, the quiet time in ``drain``, the warm-up and a fault's wait
in ``harness`` (a test patches them there)."""

from __future__ import annotations

from .harness import ChaosRun, run
from .parts import Part, ZombiePause, restart_backoff
from .plan import (
    BROKER_KILL,
    BROKER_KINDS,
    BROKER_TERM,
    BUDGET_KILL,
    COORDINATOR_KILL,
    HOST_CUT,
    HOST_KILL,
    HOST_KINDS,
    KIND_WEIGHTS,
    LOAD_KILL,
    LOAD_KILL_TRIES,
    PART_KINDS,
    STREAM_KILL,
    STREAM_PAUSE,
    WORKER_KILL,
    ChaosSpec,
    PlannedFault,
    fault_schedule,
)
from .timeline import FaultRecord

__all__ = [
    "BROKER_KILL",
    "BROKER_KINDS",
    "BROKER_TERM",
    "BUDGET_KILL",
    "COORDINATOR_KILL",
    "HOST_CUT",
    "HOST_KILL",
    "HOST_KINDS",
    "KIND_WEIGHTS",
    "LOAD_KILL",
    "LOAD_KILL_TRIES",
    "PART_KINDS",
    "STREAM_KILL",
    "STREAM_PAUSE",
    "WORKER_KILL",
    "ChaosRun",
    "ChaosSpec",
    "FaultRecord",
    "Part",
    "PlannedFault",
    "ZombiePause",
    "fault_schedule",
    "restart_backoff",
    "run",
]
