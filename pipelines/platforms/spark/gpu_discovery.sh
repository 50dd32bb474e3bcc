#!/usr/bin/env bash
# Spark GPU discovery script (spark.{driver,executor,worker}.resource.gpu.discoveryScript):
# prints the GPUs of this host as Spark expects, e.g. {"name": "gpu", "addresses": ["0","1"]}.
set -euo pipefail
addresses=$(nvidia-smi --query-gpu=index --format=csv,noheader | sed 's/.*/"&"/' | paste -sd, -)
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
