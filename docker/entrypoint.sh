#!/usr/bin/env bash
# Entrypoint of the project image (runs under tini as the non-root user `bench`): turns the
# secrets the stack passes as environment variables into the files the services read, then
# runs the command.
#
#   SPARK_AUTH_SECRET        -> $SPARK_CONF_DIR/spark-defaults.conf (0600): spark.authenticate on,
#                               this secret, AES-encrypted RPC, the master's REST submission server
#                               (no authentication) off. Read by the Spark master, workers and
#                               every driver (pyspark's spark-submit loads it), so drivers in the
#                               Celery workers authenticate to the cluster with no code change.
#   SPARK_LOCAL_IP           defaults to this container's address: Spark executors on the Spark
#                               worker connect back to drivers in the Celery workers (127.0.0.1,
#                               the project's single-machine default, would point at themselves).
#   AIRFLOW_ADMIN_PASSWORD   -> the simple auth manager's password file (0600) for
#                               AIRFLOW_ADMIN_USERNAME (default admin): the API server's login.
#   MLFLOW_AUTH_DATABASE_URI -> an MLflow basic-auth config (0600) and MLFLOW_AUTH_CONFIG_PATH;
#                               the admin user comes from MLFLOW_AUTH_ADMIN_USERNAME/PASSWORD. With
#                               the server's workspaces on, a user without a workspace-wide grant
#                               (the workers' user: docker/mlflow_init.py) sees only the
#                               experiments granted to it and cannot create one.
set -euo pipefail
umask 0077

if [ -n "${SPARK_AUTH_SECRET:-}" ]; then
  mkdir -p "$SPARK_CONF_DIR"
  cat > "$SPARK_CONF_DIR/spark-defaults.conf" <<EOF
spark.authenticate true
spark.authenticate.secret $SPARK_AUTH_SECRET
spark.network.crypto.enabled true
spark.master.rest.enabled false
EOF
fi

if [ -z "${SPARK_LOCAL_IP:-}" ]; then
  SPARK_LOCAL_IP="$(hostname -i 2>/dev/null | awk '{print $1}')"
  export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
fi

if [ -n "${AIRFLOW_ADMIN_PASSWORD:-}" ]; then
  pwfile="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/simple_auth_manager_passwords.json}"
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$pwfile"
  mkdir -p "$(dirname "$pwfile")"
  python3 - "$pwfile" <<'EOF'
import json, os, sys
user = os.environ.get("AIRFLOW_ADMIN_USERNAME") or "admin"
with open(sys.argv[1], "w") as f:
    json.dump({user: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, f)
EOF
fi

if [ -n "${MLFLOW_AUTH_DATABASE_URI:-}" ]; then
  export MLFLOW_AUTH_CONFIG_PATH="${MLFLOW_AUTH_CONFIG_PATH:-$HOME/mlflow_basic_auth.ini}"
  cat > "$MLFLOW_AUTH_CONFIG_PATH" <<EOF
[mlflow]
default_permission = ${MLFLOW_AUTH_DEFAULT_PERMISSION:-READ}
database_uri = $MLFLOW_AUTH_DATABASE_URI
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
EOF
fi

umask 0027
exec "$@"
