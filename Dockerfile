# One image for every Python service of the stack (Airflow components, Celery workers,
# MLflow server, Spark master/worker from the pyspark distribution), so versions match
# the ones tested in CI. CPU torch by default; for GPU workers build with
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim-bookworm
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/project
COPY requirements.txt .
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" torch==2.13.0 \
    && pip install --no-cache-dir -r requirements.txt
ENV PYTHONPATH=/opt/project \
    PYSPARK_PYTHON=/usr/local/bin/python \
    SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    TOKENIZERS_PARALLELISM=false
COPY . .
ENTRYPOINT ["/usr/bin/tini", "--"]
