"""The ``adpipe`` command line (also ``python -m adpipe``): a thin
dispatcher. Each package's own ``cli`` module adds its verbs and their
handlers; this module reads the settings once and runs the chosen one."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from adpipe import __version__
from adpipe.budget import cli as budget_cli
from adpipe.lakehouse import cli as lakehouse_cli
from adpipe.local import cli as local_cli
from adpipe.settings import Settings, SettingsError, load_settings
from adpipe.stream import cli as stream_cli
from adpipe.tools import cli as tools_cli

log = logging.getLogger("adpipe")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _ours_or_an_error(record: logging.LogRecord) -> bool:
    """adpipe's own warnings, and any library's errors (librdkafka's retries
    are warnings)."""
    return record.levelno >= logging.ERROR or record.name == "adpipe" or record.name.startswith("adpipe.")


def _setup_logging(verbose: bool, log_file: Path | None = None) -> None:
    """Log lines on stderr, INFO and up (DEBUG with -v). A verb that prints
    its own story (the demo) names a ``log_file``: without -v the INFO lines
    go there, and stderr keeps adpipe's warnings and everyone's errors."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if log_file is None or verbose:
        return
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setLevel(logging.WARNING)
        handler.addFilter(_ours_or_an_error)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(to_file)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adpipe",
        description="Exactly-once ad event counting on Kafka and Spark. Configuration comes from ADPIPE_* "
        "environment variables (ADPIPE_KAFKA_BOOTSTRAP, ADPIPE_SPARK_MASTER, ADPIPE_HOME, ADPIPE_BUDGET_DB, ...).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"adpipe {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    # In the order of `adpipe --help`: set-up, producing, the pipeline, checks.
    local_cli.add_parsers(sub)
    tools_cli.add_jars_parser(sub)
    tools_cli.add_status_parser(sub)
    tools_cli.add_produce_parser(sub)
    stream_cli.add_parsers(sub)
    lakehouse_cli.add_parsers(sub)
    budget_cli.add_parsers(sub)
    tools_cli.add_check_parsers(sub)
    tools_cli.add_chaos_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Run what ``parser`` makes of ``argv`` (its ``func``, given the
    arguments and the settings) as every adpipe verb runs: ``-v``, the
    settings read once, the log set up, one error line instead of a
    traceback, 130 on Ctrl-C. Also for a command line of its own built
    the same way (a ``-v`` flag and a ``func`` default), such as the
    benchmark's outside the package."""
    args = parser.parse_args(argv)
    if args.verbose:
        # The JVMs' own log lines on the console too (Spark's default), in
        # this process and in the ones it starts (the demo's stream jobs).
        os.environ["ADPIPE_JVM_LOGS"] = "console"
    try:
        settings = load_settings()
    except SettingsError as exc:
        parser.error(str(exc))
    story_log = getattr(args, "story_log", None)
    _setup_logging(args.verbose, settings.log_dir / story_log if story_log else None)
    try:
        delegated = _in_warm_driver(args, argv, settings)
        if delegated is not None:
            return delegated
        needs_metastore = getattr(args, "needs_metastore", False)
        if callable(needs_metastore):
            needs_metastore = needs_metastore(args)
        if needs_metastore:
            from adpipe.local import postgres

            postgres.serve_metastore(settings)
        if getattr(args, "serve", False):
            from adpipe.lakehouse import warm

            return warm.serve(settings, lambda request: run_command(parser, request))
        return args.func(args, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line, details at debug level
        log.debug("failure", exc_info=True)
        log.error("%s: %s", type(exc).__name__, exc)
        _explain_kafka_refusal(exc, settings)
        return 1


def _in_warm_driver(args: argparse.Namespace, argv: list[str] | None, settings: Settings) -> int | None:
    """The verb's exit status when the home's warm load driver ran it
    (adpipe.lakehouse.warm: a verb whose ``warm`` default says it may, and
    ``ADPIPE_LOAD_WARM`` not off); None: run it in this process."""
    wants = getattr(args, "warm", None)
    # A Spark Connect server's session is already warm, and any host's.
    if wants is None or getattr(args, "serve", False) or settings.load_warm == "off" or settings.spark_connect:
        return None
    if callable(wants) and not wants(args):
        return None
    from adpipe.lakehouse import warm

    if warm.SERVING:
        return None
    return warm.delegate(settings, list(sys.argv[1:] if argv is None else argv), start=settings.load_warm == "on")


def _explain_kafka_refusal(exc: Exception, settings: Settings) -> None:
    """After a Kafka failure, one more line when the cluster refuses this
    client (wrong password, no credentials for a SASL_SSL listener, an
    unverified certificate): librdkafka reports those only beside a request
    that then fails as "Broker transport failure"."""
    text = f"{type(exc).__name__} {exc}"
    if not any(word in text for word in ("KafkaError", "KafkaException", "Kafka", "SaslAuthentication")):
        return
    from adpipe import kafka_io

    try:
        reason = kafka_io.refusal(settings.kafka)
    except Exception as probe_exc:  # noqa: BLE001 - a diagnosis must never hide the failure itself
        log.debug("the Kafka probe failed: %s", probe_exc)
        return
    if reason:
        log.error("%s", reason)
