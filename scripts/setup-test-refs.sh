#!/usr/bin/env bash
# Installs the npm packages the reference tests compare against
# (tests/reference: tokenizers and the Jinja renderer) with `npm ci`, exactly
# as package-lock.json pins them. Idempotent: does nothing when node_modules
# already matches package.json + package-lock.json (a stamp file records
# their digest), so CI may run it before every test run.
#
# Tests that need these packages skip without them, and fail instead when
# STRATA_REQUIRE_REFS=1 (as CI sets it).
set -euo pipefail

ref_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/reference" && pwd)"
cd "$ref_dir"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup-test-refs: '$tool' not found (scripts/install-deps.sh installs nodejs and npm)" >&2
    exit 1
  fi
done

stamp="node_modules/.strata-lock-digest"
digest="$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  echo "setup-test-refs: $ref_dir/node_modules is up to date"
  exit 0
fi

echo "setup-test-refs: installing reference packages in $ref_dir"
npm ci --no-audit --no-fund --loglevel=error
echo "$digest" > "$stamp"
echo "setup-test-refs: done"
