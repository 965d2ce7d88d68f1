# adpipe on Airflow's own image (used by docker-compose.yaml): Airflow as Apache
# releases it, extended the way its docs show (apt packages as root, Python
# packages as the airflow user). Python 3.11, as the local venv.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
ARG PYTHON_VERSION
# Airflow's constraints for this release and Python: the versions it was tested with.
ARG AIRFLOW_CONSTRAINTS=https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${PYTHON_VERSION}.txt

USER root
# Java for Spark and Maven for the jars: the Makefile's JVM_DEBIAN_PACKAGES;
# make to run its install steps; npm for the Data Docs' stylesheets and
# scripts. The image's Debian is bookworm, which has Java 17.
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends openjdk-17-jdk-headless maven make nodejs npm \
    && apt-get autoremove -yqq --purge && apt-get clean && rm -rf /var/lib/apt/lists/*
# The project, ADPIPE_HOME, the checkpoint and warehouse's shared folder and
# Airflow's config and logs folders: the last four are named volumes in the
# compose file, which Docker makes from these folders, so they belong to the
# airflow user.
RUN mkdir -p /opt/adpipe /opt/adpipe-home /opt/adpipe-shared /opt/airflow/config /opt/airflow/logs \
    && chown airflow:0 /opt/adpipe /opt/adpipe-home /opt/adpipe-shared /opt/airflow/config /opt/airflow/logs
USER airflow
WORKDIR /opt/adpipe

COPY --chown=airflow:0 requirements.txt pyproject.toml Makefile ./
COPY --chown=airflow:0 deploy/data-docs ./deploy/data-docs
COPY --chown=airflow:0 include ./include
# The same install steps as `make venv` and `make jars`, into Airflow's own
# environment: the Makefile's python-packages target (the pins of
# requirements.txt, every other package held to Airflow's constraints), then
# the JVM jars from Maven Central into .cache/jvm, the Data Docs' assets
# from npm into .cache/data-docs.
RUN make python-packages PYTHON=python PIP=pip AIRFLOW_CONSTRAINTS=${AIRFLOW_CONSTRAINTS} \
    && adpipe jars && make data-docs-assets
COPY --chown=airflow:0 jobs ./jobs
COPY --chown=airflow:0 dags ./dags

ENV ADPIPE_HOME=/opt/adpipe-home
