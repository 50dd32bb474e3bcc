# One image for every Python service of the stack (Airflow components, Celery workers, MLflow
# server, Spark master/worker from the pyspark distribution), so versions match the ones tested
# in CI. Needs BuildKit (the default of `docker compose build` and of Docker >= 23).
#
#   docker compose build                                   # python:3.11-slim-bookworm, CPU torch
#   docker compose build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128   # GPU workers
#
# Build arguments:
#   BASE_IMAGE   a Debian bookworm image; with Python 3.11 (the official python image) or without
#                (then Debian's python3 3.11 is installed): the offline test stack builds FROM a
#                debootstrap image (docker-compose.test.yaml, scripts/compose_e2e.sh)
#   TORCH_INDEX  the package index torch comes from (CPU wheels by default; a CUDA index for GPUs)
#   BENCH_UID    uid of the non-root user `bench` every service runs as (group 0)
# Wheels placed in docker/wheels/ (ignored by git) are preferred by pip; the test stack puts the
# CPU torch wheel there. pip's downloads stay in a BuildKit cache mount between builds.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG BENCH_UID=50000
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8

# Java for Spark, tini as PID 1, procps for Spark's scripts; Debian's Python where the base has none.
RUN set -eux; \
    pkgs="openjdk-17-jre-headless procps tini ca-certificates"; \
    command -v python3 >/dev/null || pkgs="$pkgs python3 python3-venv"; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pkgs; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv
COPY requirements.txt /tmp/requirements.txt
# pip as in CI (Debian's 23.0 backtracks for minutes over fastapi), torch from TORCH_INDEX
# (otherwise pip resolves PyPI's multi-GB CUDA build), then the pins, with MLflow's `auth` extra
# (Flask-WTF) that the server's basic-auth app needs.
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    set -eux; \
    pip install "pip==26.3"; \
    pip install --find-links /tmp/wheels --index-url "$TORCH_INDEX" "torch==2.13.0"; \
    pip install --find-links /tmp/wheels -r /tmp/requirements.txt \
        "$(grep -E '^mlflow==' /tmp/requirements.txt | sed 's/^mlflow/mlflow[auth]/')"; \
    python -c "import torch, airflow, pyspark, mlflow, determined, flask_wtf; print('torch', torch.__version__)"

# iproute2: a training cell brings up the loopback of its own network namespace (unshare + `ip link
# set lo up`, pipelines/platforms/torchrun.py). A layer of its own, after the pip one, keeps that cached.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends iproute2; \
    rm -rf /var/lib/apt/lists/*

# Non-root: every service runs as `bench` (group 0, so an arbitrary uid with gid 0 works too).
RUN set -eux; \
    useradd --uid "$BENCH_UID" --gid 0 --create-home --home-dir /home/bench --shell /bin/bash bench; \
    mkdir -p /opt/project /opt/airflow/logs /opt/runs /opt/hf-cache /opt/spark-conf /opt/spark-work \
             /mlflow/artifacts; \
    chown -R bench:0 /opt/airflow /opt/runs /opt/hf-cache /opt/spark-conf /opt/spark-work /mlflow; \
    chmod -R g+rwX /opt/airflow /opt/runs /opt/hf-cache /opt/spark-work /mlflow; \
    chmod 0770 /opt/spark-conf

COPY docker/entrypoint.sh /usr/local/bin/bench-entrypoint
COPY docker/airflow_init.sh /usr/local/bin/airflow-init
COPY docker/mlflow_init.py /usr/local/bin/mlflow-init
WORKDIR /opt/project
COPY pyproject.toml requirements.txt README.md ./
COPY pipelines pipelines
COPY dags dags
COPY plugins plugins
COPY scripts scripts
COPY bench bench
COPY deploy deploy

ENV PYTHONPATH=/opt/project \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    SPARK_CONF_DIR=/opt/spark-conf \
    SPARK_WORKER_DIR=/opt/spark-work \
    AIRFLOW_HOME=/opt/airflow \
    BENCHMARK_OUTPUT_ROOT=/opt/runs \
    HF_HOME=/opt/hf-cache \
    HOME=/home/bench \
    TOKENIZERS_PARALLELISM=false
USER bench
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/bench-entrypoint"]
CMD ["bash"]
