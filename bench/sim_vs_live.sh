#!/usr/bin/env bash
# Simulated against live (issue "strata bench"): the same trace requests, at
# the same scale and the same closed loop of users, sent to a live
# `strata serve` and replayed by `strata bench simulate` with a cost model
# calibrated on this machine in the same run (`strata bench calibrate`), so
# both see the same conditions. Prints TTFT p50 and throughput side by side
# with simulated ÷ live, and whether each is within 25%.
#
# Usage: bench/sim_vs_live.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (a bench-110m q8_0 synthesised
#   into OUT_DIR), THREADS (2), REQUESTS (200: the first N requests of the
#   trace), TOKENS_PER_ID (16), CONCURRENCY (4), DEVICE_BYTES (160M, the
#   server's device KV pool; the simulated pool has the same blocks),
#   TRACE (../shared/traces/synthetic_trace.jsonl), TOLERANCE (0.25).
# Exit status: 0 when both figures are within TOLERANCE, 3 when not, other
# non-zero on a failure. Needs python3 (arithmetic on the JSON reports).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/sim_instance.sh
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-sim-vs-live-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
THREADS=${THREADS:-2}
REQUESTS=${REQUESTS:-200}
TOKENS_PER_ID=${TOKENS_PER_ID:-16}
CONCURRENCY=${CONCURRENCY:-4}
DEVICE_BYTES=${DEVICE_BYTES:-160M}
TRACE=${TRACE:-../shared/traces/synthetic_trace.jsonl}
TOLERANCE=${TOLERANCE:-0.25}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi
CTX=$("$STRATA" model info "$MODEL" 2>/dev/null | sed -n 's/^context *\([0-9]*\) tokens.*/\1/p')
CTX=${CTX:-4096}
echo "sim vs live: $REQUESTS requests at $TOKENS_PER_ID tokens per id, $CONCURRENCY users, $THREADS threads, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# 1. The cost model, measured now.
"$STRATA" bench calibrate --model "$MODEL" --threads "$THREADS" --out "$OUT/costs.json" > /dev/null 2> "$OUT/calibrate.log"
tail -1 "$OUT/calibrate.log" >&2

# 2. Live.
PORTS="$OUT/ports.json"
rm -f "$PORTS"
"$STRATA" serve --model "$MODEL" --threads "$THREADS" --port 0 --grpc-port -1 --port-file "$PORTS" \
  --kv-device-bytes "$DEVICE_BYTES" --log-level warn > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -s "$PORTS" ] && break; sleep 0.1; done
PORT=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" "$PORTS")
"$STRATA" bench run --url "http://127.0.0.1:$PORT" --workload "trace:$TRACE" --tokens-per-hash-id "$TOKENS_PER_ID" \
  --max-requests "$REQUESTS" --concurrency "$CONCURRENCY" --no-plots --no-progress --scrape-interval 0 \
  --out "$OUT/live.json" > "$OUT/live.txt" 2>&1
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" || true
kill -TERM $SERVER; wait $SERVER 2>/dev/null || true
trap - EXIT

# 3. Simulated: one instance shaped as the server (its defaults: 64
# sequences, 512 tokens per step, 16-token f16 blocks), the calibrated costs.
{
  echo "instances: 1"
  sim_instance_yaml "$DEVICE_BYTES" costs.json
} > "$OUT/cluster.yaml"
"$STRATA" bench simulate --trace "$TRACE" --cluster "$OUT/cluster.yaml" --tokens-per-hash-id "$TOKENS_PER_ID" \
  --max-requests "$REQUESTS" --concurrency "$CONCURRENCY" --max-model-len "$CTX" --json > "$OUT/sim.json"

# 4. Side by side.
python3 - "$OUT" "$TOLERANCE" <<'PY'
import json, re, sys
out, tol = sys.argv[1], float(sys.argv[2])
live = json.load(open(f"{out}/live.json"))["summary"]
sim = json.load(open(f"{out}/sim.json"))
def metric(name):
    try:
        m = re.search(r'^' + re.escape(name) + r'\{[^}]*\} ([0-9.eE+-]+)$', open(f"{out}/metrics.txt").read(), re.M)
    except OSError:
        return float("nan")
    return float(m.group(1)) if m else float("nan")
rows = [
    ("requests finished", live["requests_ok"], sim["requests"], False),
    ("hit ratio (tokens)", live["cached_tokens"] / max(1, live["prompt_tokens"]), sim["hit_ratio_tokens"], False),
    ("TTFT p50 (s)", live["ttft_s"]["p50"], sim["ttft_p50_s"], True),
    ("TTFT p99 (s)", live["ttft_s"]["p99"], sim["ttft_p99_s"], False),
    ("TPOT p50 (s)", live["tpot_s"]["p50"], sim["tpot_p50_s"], False),
    ("output tokens/s", live["output_token_throughput"], sim["throughput_tokens_per_s"], True),
    ("total tokens/s", live["total_token_throughput"], sim["total_tokens_per_s"], False),
    ("duration (s)", live["duration_s"], sim["duration_s"], False),
    ("engine steps", metric("strata_engine_steps_total"), sim["steps"], False),
    ("engine busy (s)", metric("strata_engine_forward_seconds_total"), sim["busy_s"], False),
]
print(f"{'figure':<20} {'live':>12} {'simulated':>12} {'sim/live':>9}")
bad = 0
for name, l, s, checked in rows:
    ratio = s / l if l else float("nan")
    mark = ""
    if checked:
        ok = abs(ratio - 1) <= tol
        bad += not ok
        mark = "  within %d%%" % round(tol * 100) if ok else "  OUTSIDE %d%%" % round(tol * 100)
    print(f"{name:<20} {l:>12.4g} {s:>12.4g} {ratio:>9.3f}{mark}")
sys.exit(3 if bad else 0)
PY
