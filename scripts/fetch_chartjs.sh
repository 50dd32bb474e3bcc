#!/usr/bin/env bash
# Re-fetch the vendored Chart.js (the Benchmarks page's charts) from the npm registry.
#   bash scripts/fetch_chartjs.sh            # the pinned version (plugins/static/chartjs/VERSION)
#   bash scripts/fetch_chartjs.sh 4.7.0      # another version: updates VERSION and SHA256SUMS
# `npm pack` downloads the package tarball (checked against the registry's integrity hash);
# its UMD bundle and license are copied into plugins/static/chartjs/, and the bundle's sha256
# is compared with SHA256SUMS (same version) or written there (new version). Needs node/npm.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/plugins/static/chartjs"
PINNED="$(cat "$DEST/VERSION")"
VERSION="${1:-$PINNED}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent "chart.js@$VERSION" >/dev/null && tar xzf "chart.js-$VERSION.tgz")
got="$(node -p "require('$TMP/package/package.json').version")"
[ "$got" = "$VERSION" ] || { echo "npm gave chart.js $got, not $VERSION" >&2; exit 1; }
if [ "$VERSION" = "$PINNED" ]; then
  (cd "$TMP/package/dist" && sha256sum -c "$DEST/SHA256SUMS") \
    || { echo "chart.js $VERSION from npm differs from the recorded sha256" >&2; exit 1; }
fi
cp "$TMP/package/dist/chart.umd.min.js" "$DEST/chart.umd.min.js"
cp "$TMP/package/LICENSE.md" "$DEST/LICENSE.md"
echo "$VERSION" > "$DEST/VERSION"
(cd "$DEST" && sha256sum chart.umd.min.js > SHA256SUMS)
echo "chart.js $VERSION -> $DEST ($(wc -c < "$DEST/chart.umd.min.js") bytes, $(cut -c1-16 "$DEST/SHA256SUMS")...)"
