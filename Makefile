# adpipe: one entry point for set-up, checks and runs. `make help` lists targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help deps deps-ui data-docs-assets venv python-packages jars demo test test-slow test-ui test-long test-extended test-all test-unit lint bench bench-stages kafka-up kafka-down pg-up pg-down spark-up spark-down chaos airflow clean

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Java for Spark (a JDK: javac builds adpipe's own Spark functions) and Maven
# for the jars (the Dockerfile installs these too), the PostgreSQL server of
# the embedded default, npm for the Data Docs' stylesheets and scripts, and
# iproute2 for the tests' hosts on one machine (tests/hosts.py), Redis for
# Airflow's CeleryExecutor across them (its broker).
JVM_DEBIAN_PACKAGES := openjdk-17-jdk-headless maven
HAS_IP := { command -v ip || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; } >/dev/null

deps: ## system packages (Java 17+, Maven, PostgreSQL server, npm, iproute2, Redis) if missing; needs root or sudo
	@command -v java >/dev/null && command -v javac >/dev/null && command -v mvn >/dev/null && command -v npm >/dev/null && $(HAS_IP) && command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  PKGS="$(JVM_DEBIAN_PACKAGES) postgresql"; command -v npm >/dev/null || PKGS="$$PKGS nodejs npm"; \
	  $(HAS_IP) || PKGS="$$PKGS iproute2"; command -v redis-server >/dev/null || PKGS="$$PKGS redis-server"; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$PKGS; }

# Great Expectations' Data Docs load their stylesheets and scripts from CDNs.
# npm installs them, at the versions GE's templates name (deploy/data-docs:
# package.json and its lock), into .cache/data-docs; adpipe copies them into
# each Data Docs site and points the pages at them
# (adpipe.lakehouse.quality.offline). npm's own cache is .cache/npm, and an
# install newer than the lock is kept: a second run needs no network.
DOCS_ASSETS := .cache/data-docs
DOCS_ASSETS_STAMP := $(DOCS_ASSETS)/node_modules/.package-lock.json

$(DOCS_ASSETS_STAMP): deploy/data-docs/package.json deploy/data-docs/package-lock.json deploy/data-docs/.npmrc
	@command -v npm >/dev/null || { echo "npm is missing: make deps installs it"; exit 1; }
	mkdir -p $(DOCS_ASSETS)
	cp deploy/data-docs/package.json deploy/data-docs/package-lock.json deploy/data-docs/.npmrc $(DOCS_ASSETS)/
	cd $(DOCS_ASSETS) && npm ci --cache ../npm --prefer-offline --ignore-scripts --no-audit --no-fund
	touch $(DOCS_ASSETS_STAMP)

data-docs-assets: $(DOCS_ASSETS_STAMP) ## the Data Docs' stylesheets, scripts and fonts (npm, pinned) into .cache/data-docs

deps-ui: ## Debian's Chromium for make test-ui (Playwright drives it; it never downloads a browser); needs root or sudo
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; }

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(MAKE) python-packages PYTHON=$(BIN)/python PIP=$(BIN)/pip
	touch $(STAMP)

# The one install step of the Python packages, for the venv above and for the
# Dockerfile (PIP=pip AIRFLOW_CONSTRAINTS=<Airflow's constraints URL>): the pins
# of requirements.txt win, every other package is held to Airflow's
# constraints when given (adpipe.tools.constraints), then adpipe itself.
PIP ?= $(BIN)/pip
AIRFLOW_CONSTRAINTS ?=
CONSTRAINTS_FILE := .cache/constraints.txt

python-packages: ## requirements.txt (under AIRFLOW_CONSTRAINTS=URL|file when given) and adpipe into PIP's environment
	PYTHONPATH=include $(PYTHON) -m adpipe.tools.constraints --requirements requirements.txt \
	  --airflow-constraints "$(AIRFLOW_CONSTRAINTS)" --out $(CONSTRAINTS_FILE)
	$(PIP) install -q -r requirements.txt --constraint $(CONSTRAINTS_FILE)
	$(PIP) install -q --no-deps -e .

venv: deps $(STAMP) data-docs-assets ## Python environment with every pinned package, and the Data Docs' assets

jars: venv ## JVM jars from Maven Central into .cache/jvm, and the Spark drivers' class archives (once)
	$(BIN)/adpipe jars

demo: jars ## the pipeline end to end with a crash injected, ending in the verify report
	$(BIN)/adpipe demo

test: jars ## the suite on two workers, each with its own broker, PostgreSQL and ports: a test file runs on one worker, in order (under 30 min)
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "not slow and not ui"

test-slow: jars ## the long scenarios kept out of make test's 30 minutes, on two workers as make test (extended ones included)
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder -m slow

test-ui: jars deps-ui ## the Airflow UI in headless Chromium against the real scheduler; screenshots under ADPIPE_TEST_HOME/ui/screenshots
	$(BIN)/pytest -m ui

test-long: jars deps-ui ## the slow and UI tests but the extended ones, in one run on the two workers (CI runs it after make test)
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "(slow or ui) and not extended"

test-extended: jars ## the extended scenarios CI leaves out (loads killed by arrival, older tables migrated, PostgreSQL outages, the Spark cluster, HDFS, metrics, the demo's secrets, Airflow's scheduler on its own)
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder -m extended

test-all: test test-long test-extended ## every test: make test, then test-long, then test-extended (before a release)

# The benchmark harness is bench/ at the project root, not part of the
# installed package: python -m bench runs it from here.
# A mode in ARGS (--failover, --hour-close, --stream-caps, --budget-batch-sizes) runs alone instead.
BENCH_MODES := --failover --hour-close --load-sessions --stream-caps --budget-batch-sizes
bench: jars ## adpipe beside Spark batch/at-least-once, quixstreams and PyFlink on 1M events (ARGS="--ads 10000", "--latency", "--only a,b"), the watermark alignment's cost in events/s and p99 latency, then Union & Load and the budget service at 10,000 ads; alone: ARGS="--failover [--part stream|budget|broker | --hosts 2]", "--hour-close", "--stream-caps N,..."
ifneq (,$(filter $(BENCH_MODES),$(ARGS)))
	$(BIN)/python -m bench $(ARGS)
else
	$(BIN)/python -m bench --peers --install-only
	$(BIN)/python -m bench --peers $(ARGS)
	$(BIN)/python -m bench --peers --only adpipe,adpipe_unaligned --latency --latency-duration 180
	$(BIN)/python -m bench --events 1000000 --ads 10000 --minutes 60
endif

bench-stages: jars ## time each stage for 20,000 events (JSON under .adpipe/bench/); ARGS="--stream-caps ..." for the batch-cap sweep
	$(BIN)/python -m bench $(ARGS)

# `make chaos`: its own home and ports, beside a demo broker or a test run. A
# warm standby driver runs beside the active one (as the stream DAG keeps one
# with ADPIPE_STREAM_STANDBY=on); each worker offers room for the active
# driver's executor, the standby's and a load's.
CHAOS_ENV := ADPIPE_HOME=$(CURDIR)/.adpipe-chaos ADPIPE_KAFKA_BOOTSTRAP=127.0.0.1:39092 \
  ADPIPE_KAFKA_CONTROLLER_PORT=39093 ADPIPE_PG_PORT=39094 ADPIPE_SPARK_MASTER_PORT=39095 \
  ADPIPE_SPARK_MASTER_UI_PORT=39096 ADPIPE_SPARK_MASTER=spark://127.0.0.1:39095 \
  ADPIPE_SPARK_WORKER_CORES=3 ADPIPE_SPARK_WORKER_MEMORY=3g ADPIPE_SPARK_CORES_MAX=2 ADPIPE_STREAM_STANDBY=on

# With ARGS="--hosts N" the run makes its own hosts (Linux namespaces, root)
# and starts three brokers and PostgreSQL on a services host among them.
chaos: jars ## the pipeline under random faults on three brokers and a 2-worker Spark cluster, then the check (ARGS="--events N --duration S --seed S [--hosts N]")
ifneq ($(findstring --hosts,$(ARGS)),)
	env $(CHAOS_ENV) $(BIN)/adpipe chaos $(ARGS)
else
	env $(CHAOS_ENV) $(BIN)/adpipe kafka up --brokers 3
	env $(CHAOS_ENV) $(BIN)/adpipe pg up
	env $(CHAOS_ENV) $(BIN)/adpipe spark up --workers 2
	env $(CHAOS_ENV) $(BIN)/adpipe chaos $(ARGS); rc=$$?; \
	  env $(CHAOS_ENV) $(BIN)/adpipe spark down; env $(CHAOS_ENV) $(BIN)/adpipe kafka down; \
	  env $(CHAOS_ENV) $(BIN)/adpipe pg down; exit $$rc
endif

test-unit: jars ## unit tests only
	$(BIN)/pytest tests/unit

lint: venv ## ruff
	$(BIN)/ruff check include jobs dags tests bench

kafka-up: jars ## start the local broker
	$(BIN)/adpipe kafka up

kafka-down: venv ## stop the local broker
	$(BIN)/adpipe kafka down

pg-up: venv ## start the local PostgreSQL
	$(BIN)/adpipe pg up

pg-down: venv ## stop the local PostgreSQL
	$(BIN)/adpipe pg down

spark-up: venv ## start a local Spark standalone cluster (WORKERS=2); jobs use it with ADPIPE_SPARK_MASTER
	$(BIN)/adpipe spark up --workers $(or $(WORKERS),2)

spark-down: venv ## stop the local Spark cluster
	$(BIN)/adpipe spark down

airflow: jars ## Airflow 3 locally (metadata in the local PostgreSQL), DAGs loaded; prints the UI address and login
	$(BIN)/python -m adpipe.local.airflow

clean: ## remove local state (broker data, checkpoints), keep the caches
	-$(BIN)/adpipe kafka down
	-$(BIN)/adpipe pg down
	-$(BIN)/adpipe spark down
	-env $(CHAOS_ENV) $(BIN)/adpipe spark down
	-env $(CHAOS_ENV) $(BIN)/adpipe kafka down
	-env $(CHAOS_ENV) $(BIN)/adpipe pg down
	rm -rf .adpipe .adpipe-test .adpipe-chaos
