#!/usr/bin/env bash
# Builds and runs every test: the Release suite (unit + integration + e2e),
# then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Usage: bash scripts/test.sh [--no-sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/setup-test-refs.sh

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 600

if [ "${1:-}" != "--no-sanitizers" ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=address,undefined
  ninja -C build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit --timeout 900
fi
