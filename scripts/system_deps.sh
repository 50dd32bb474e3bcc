#!/usr/bin/env bash
# System packages: Java 17 (Spark) for every run; the tests also need Debian's Chromium
# (browser e2e tests), OpenSSH, client and server (pipelines.cluster.ssh: hosts reached over
# ssh; its test runs sshd inside emulated hosts; Debian's policy-rc.d / no init keeps the
# package's own sshd service from starting) and Node.js (tests/web/test_webview.py runs the page's
# JavaScript link relay under node; Debian's 18 will do). `bash scripts/system_deps.sh --smoke`:
# only what the smoke run needs.
set -euo pipefail
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
[ "${1:-}" = "--smoke" ] || command -v chromium >/dev/null || missing+=(chromium)
[ "${1:-}" = "--smoke" ] || command -v ssh >/dev/null || missing+=(openssh-client)
[ "${1:-}" = "--smoke" ] || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
[ "${1:-}" = "--smoke" ] || command -v node >/dev/null || missing+=(nodejs)
command -v unshare >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "please install: ${missing[*]} (needs root)" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "system deps ok: $(java -version 2>&1 | head -1); $(chromium --version 2>/dev/null); $(ssh -V 2>&1); node $(node --version 2>/dev/null)"
