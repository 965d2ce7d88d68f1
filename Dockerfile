# adpipe's jobs and CLI in a container (used by docker-compose.yaml).
FROM python:3.11-slim-bookworm
RUN apt-get update -q && apt-get install -y -q --no-install-recommends openjdk-17-jre-headless maven make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/adpipe
COPY requirements.txt pyproject.toml Makefile ./
COPY include ./include
RUN pip install -q -r requirements.txt && pip install -q --no-deps -e . && adpipe jars
COPY jobs ./jobs
COPY dags ./dags
ENV ADPIPE_HOME=/var/lib/adpipe
ENTRYPOINT ["adpipe"]
