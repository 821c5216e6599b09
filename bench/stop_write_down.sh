#!/usr/bin/env bash
# How long a graceful stop's write-down takes (kv.stop_write_down_seconds,
# docs/kv-cache.md), next to the disk's raw O_DIRECT write rate measured in
# the same run. Per round: a fresh `strata serve` (bench-110m q8_0, device
# DEVICE_BYTES, host HOST_BYTES, a disk tier of DISK_BYTES in a fresh
# directory under DISK_DIR) takes PROMPTS distinct prompts of about WORDS
# words each (enough to fill the disk, so it has given up its copies of what
# the device and host hold), then SIGTERM; the server's log line gives the
# blocks written down and the seconds. Then `strata bench kvcache --parts
# disk` at the same block size in the same directory gives the raw O_DIRECT
# and disk-store write rates. Prints one line per round:
#   round N: wrote B blocks (MB) in S s = X GB/s; raw O_DIRECT write Y GB/s,
#   store write Z GB/s; write-down / raw = R
#
# Usage: bench/stop_write_down.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (synthesised into OUT_DIR),
#   ROUNDS (2), PROMPTS (12), WORDS (800), DEVICE_BYTES (256M),
#   HOST_BYTES (512M), DISK_BYTES (1G), DISK_DIR (/var/tmp), PORT (18123).
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-write-down-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROUNDS=${ROUNDS:-2}
PROMPTS=${PROMPTS:-12}
WORDS=${WORDS:-800}
DEVICE_BYTES=${DEVICE_BYTES:-256M}
HOST_BYTES=${HOST_BYTES:-512M}
DISK_BYTES=${DISK_BYTES:-1G}
DISK_DIR=${DISK_DIR:-/var/tmp}
PORT=${PORT:-18123}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi

# A prompt of WORDS words drawn from a small vocabulary, seeded by $1.
prompt() {
  awk -v seed="$1" -v n="$WORDS" 'BEGIN {
    srand(seed); split("alpha beta gamma delta epsilon zeta eta theta iota kappa", w, " ");
    for (i = 0; i < n; i++) printf "%s ", w[int(rand() * 10) + 1]; }'
}

for round in $(seq 1 "$ROUNDS"); do
  disk=$(mktemp -d "$DISK_DIR/strata-write-down-disk-XXXXXX")
  log="$OUT/serve-$round.log"
  "$STRATA" serve --model "$MODEL" --port "$PORT" --grpc-port -1 --served-model-name m --kv-device-bytes "$DEVICE_BYTES" \
    --kv-host-bytes "$HOST_BYTES" --kv-disk-path "$disk" --kv-disk-bytes "$DISK_BYTES" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  for i in $(seq 1 "$PROMPTS"); do
    body=$(printf '{"model":"m","prompt":"%s","max_tokens":1}' "$(prompt $((round * 1000 + i)))")
    code=$(curl -s -o /dev/null -w '%{http_code}' "localhost:$PORT/v1/completions" \
      -H 'content-type: application/json' -d "$body")
    [ "$code" = 200 ] || { echo "request $i: HTTP $code" >&2; kill "$pid"; exit 1; }
  done
  kill -TERM "$pid"
  wait "$pid"
  line=$(grep 'blocks down to the disk tier' "$log") || { echo "no write-down line in $log" >&2; exit 1; }
  blocks=$(sed -E 's/.*wrote ([0-9]+) blocks down.*/\1/' <<<"$line")
  secs=$(sed -E 's/.* in ([0-9.]+) s .*/\1/' <<<"$line")
  # Block bytes from the start-up line: "<n> KV blocks of <t> tokens (<m> MiB)".
  read -r nblocks mib < <(sed -nE 's/.* ([0-9]+) KV blocks of [0-9]+ tokens \(([0-9]+) MiB\).*/\1 \2/p' "$log")
  block_bytes=$(( mib * 1048576 / nblocks / 4096 * 4096 ))
  rm -rf "$disk"
  base=$("$STRATA" bench kvcache --parts disk --disk-sizes "$((block_bytes / 1024))K" \
    --disk-total-bytes "$((blocks * block_bytes / 1048576 + 1))M" --disk-path "$DISK_DIR" --iterations 3 --json)
  awk -v r="$round" -v b="$blocks" -v bb="$block_bytes" -v s="$secs" -v j="$base" 'BEGIN {
    match(j, /"raw_write_gbs": *[0-9.e+-]+/); raw = substr(j, RSTART, RLENGTH); sub(/.*: */, "", raw);
    match(j, /"store_write_gbs": *[0-9.e+-]+/); st = substr(j, RSTART, RLENGTH); sub(/.*: */, "", st);
    mb = b * bb / 1e6; gbs = s > 0 ? mb / 1e3 / s : 0;
    printf "round %d: wrote %d blocks (%.0f MB) in %.3f s = %.2f GB/s; raw O_DIRECT write %.2f GB/s, store write %.2f GB/s; write-down / raw = %.2f\n",
      r, b, mb, s, gbs, raw, st, (raw > 0 ? gbs / raw : 0) }'
done
