#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) are up: the tests use them
# as Airflow's production metadata DB / Celery broker. Starts them only where they are not running.
set -euo pipefail
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  else
    echo "PostgreSQL is not running on 127.0.0.1:5432 and cannot be started here" >&2; exit 1
  fi
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  else
    echo "Redis is not running on 127.0.0.1:6379 and cannot be started here" >&2; exit 1
  fi
fi
for _ in $(seq 1 30); do
  pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break
  sleep 1
done
echo "services ok: $(pg_isready -h 127.0.0.1 -p 5432); redis $(redis-cli -h 127.0.0.1 ping)"
