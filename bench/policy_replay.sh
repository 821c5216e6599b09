#!/usr/bin/env bash
# Eviction policies validated live (issue 22): `strata bench run` replays the
# first MAX_REQUESTS requests of a trace (16 tokens per hash id, one user,
# closed loop) against a fresh `strata serve` per run, for each policy in
# POLICIES, ROUNDS rounds alternating (the order flips every round). The
# server's tiers: DEVICE_BLOCKS device blocks and HOST_BLOCKS host blocks
# (the defaults hold ~10% of the unique blocks of the shared trace's first
# 1,000 requests), the host tier's write policy the server's default unless
# HOST_WRITE_POLICY is set; with DISK_BLOCKS > 0 also a disk tier of that
# many blocks (a fresh directory under OUT_DIR per run), write policy
# DISK_WRITE_POLICY (default exclusive). Prints per run the hit ratio (tokens), TTFT
# p50/p90/mean and the run's length; then `strata bench simulate` of the
# same configuration per policy (the hit ratio in blocks that the live run
# should reproduce; requests over the model's context are skipped in both).
# The server's strata_kv_* metrics at the end of each run go to
# OUT_DIR/r<round>-<policy>.metrics.txt.
#
# Usage: bench/policy_replay.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (bench-110m q8_0 synthesised into
#   OUT_DIR), TRACE (../shared/traces/synthetic_trace.jsonl), POLICIES
#   ("lru s3fifo"), ROUNDS (3), MAX_REQUESTS (1000), DEVICE_BLOCKS (400),
#   HOST_BLOCKS (1600), HOST_WRITE_POLICY (unset: the server's default),
#   DISK_BLOCKS (0), DISK_WRITE_POLICY (exclusive), THREADS (2).
# Exit status 0; non-zero on a failure. Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-policy-replay-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TRACE=${TRACE:-../shared/traces/synthetic_trace.jsonl}
POLICIES=${POLICIES:-lru s3fifo}
ROUNDS=${ROUNDS:-3}
MAX_REQUESTS=${MAX_REQUESTS:-1000}
DEVICE_BLOCKS=${DEVICE_BLOCKS:-400}
HOST_BLOCKS=${HOST_BLOCKS:-1600}
DISK_BLOCKS=${DISK_BLOCKS:-0}
DISK_WRITE_POLICY=${DISK_WRITE_POLICY:-exclusive}
THREADS=${THREADS:-2}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi
# The model's context: the server refuses longer requests (bench run counts
# them as skipped), so the simulator must skip the same ones.
CTX=$("$STRATA" model info "$MODEL" 2>/dev/null | sed -n 's/^context *\([0-9]*\) tokens.*/\1/p')
CTX=${CTX:-4096}
BLOCK_BYTES=589824  # bench-110m: 12 layers x 2 x 16 tokens x 768 x f16
WRITE=()
if [ -n "${HOST_WRITE_POLICY:-}" ]; then WRITE=(--kv-host-write-policy "$HOST_WRITE_POLICY"); fi

source bench/processes.sh

read -r -a policies <<< "$POLICIES"
for round in $(seq 1 "$ROUNDS"); do
  order=("${policies[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#policies[@]} - 1; i >= 0; i--)); do order+=("${policies[i]}"); done
  fi
  for p in "${order[@]}"; do
    tag="r$round-$p"
    rm -f "$OUT/$tag.port"
    DISK=()
    if [ "$DISK_BLOCKS" -gt 0 ]; then
      rm -rf "$OUT/$tag.disk"
      DISK=(--kv-disk-path "$OUT/$tag.disk" --kv-disk-bytes $((DISK_BLOCKS * BLOCK_BYTES))
            --kv-disk-write-policy "$DISK_WRITE_POLICY")
    fi
    "$STRATA" serve --model "$MODEL" --port 0 --grpc-port -1 --port-file "$OUT/$tag.port" --threads "$THREADS" \
      --kv-block-size 16 --kv-device-bytes $((DEVICE_BLOCKS * BLOCK_BYTES)) \
      --kv-host-bytes $((HOST_BLOCKS * BLOCK_BYTES)) "${WRITE[@]}" "${DISK[@]}" --kv-eviction-policy "$p" \
      --log-level warn > "$OUT/$tag.serve.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    port=$(port_of "$OUT/$tag.port")
    start=$(date +%s)
    "$STRATA" bench run --url "http://127.0.0.1:$port" --workload "trace:$TRACE" --max-requests "$MAX_REQUESTS" \
      --tokens-per-hash-id 16 --concurrency 1 --out "$OUT/$tag.json" > "$OUT/$tag.bench.log" 2>&1
    echo "$(( $(date +%s) - start ))" > "$OUT/$tag.seconds"
    # The server's KV counters (tier writes, write-backs dropped, refused, failed loads).
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^strata_kv_' > "$OUT/$tag.metrics.txt" || true
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$OUT/$tag.disk"
  done
done

python3 - "$OUT" "$ROUNDS" "$POLICIES" <<'PY'
import json, sys
out, rounds, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print(f"{'round':<6} {'policy':<10} {'hit ratio':>10} {'TTFT p50':>9} {'TTFT p90':>9} {'TTFT mean':>10} {'run s':>6}")
for r in range(1, rounds + 1):
    for p in policies:
        j = json.load(open(f"{out}/r{r}-{p}.json"))["summary"]
        s = open(f"{out}/r{r}-{p}.seconds").read().strip()
        print(f"{r:<6} {p:<10} {j['hit_ratio_responses']['ratio']:>10.4f} {j['ttft_s']['p50']:>9.3f} "
              f"{j['ttft_s']['p90']:>9.3f} {j['ttft_s']['mean']:>10.3f} {s:>6}")
PY

echo "simulated (strata bench simulate, the same tiers, serial):"
for p in "${policies[@]}"; do
  sim_write=()
  if [ -n "${HOST_WRITE_POLICY:-}" ]; then sim_write=(--host-write-policy "$HOST_WRITE_POLICY"); fi
  "$STRATA" bench simulate --trace "$TRACE" --instances 1 --serial --max-requests "$MAX_REQUESTS" \
    --max-model-len "$CTX" --tokens-per-hash-id 16 --device-bytes $((DEVICE_BLOCKS * BLOCK_BYTES)) --host-bytes $((HOST_BLOCKS * BLOCK_BYTES)) \
    --disk-bytes $((DISK_BLOCKS * BLOCK_BYTES)) --disk-write-policy "$DISK_WRITE_POLICY" \
    "${sim_write[@]}" --kv-eviction-policy "$p" --json > "$OUT/sim-$p.json"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(f'  {sys.argv[2]:<10} hit_ratio_blocks {j[\"hit_ratio_blocks\"]:.4f}  flat LRU {j[\"lru_hit_ratio_blocks\"]:.4f}  Belady {j[\"belady_hit_ratio_blocks\"]:.4f}')" "$OUT/sim-$p.json" "$p"
done
