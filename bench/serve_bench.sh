#!/usr/bin/env bash
# Serving benchmark (issue 5): throughput and TTFT of `strata serve` at
# concurrency 1, 16 and 64 on a bench-110m model, and the server's own
# overhead against engine time:
#   - front end: request received → submitted to the engine (parse,
#     validate, tokenize), from strata_request_frontend_time_seconds;
#   - TTFT as the client sees it minus TTFT inside the engine
#     (strata_time_to_first_token_seconds, from Submit): everything the HTTP
#     path adds before the first token reaches the client;
#   - per-token streaming overhead: the client's mean inter-token gap minus
#     the engine's (strata_inter_token_latency_seconds).
# Limit measured in the same run: `strata bench kernels` (the engine alone,
# no server) gives prefill tokens/s and decode tokens/s at each batch size;
# a request of P prompt and O output tokens then needs at least
# P/prefill + O/decode(batch) seconds of engine time per request, so the
# engine-bound output rate is O / that, and `ratio` = served output tokens/s
# ÷ engine-bound output tokens/s shows what serving (scheduling, HTTP,
# sampling, detokenization, streaming) costs.
#
# Usage: bench/serve_bench.sh [OUT_DIR]   (env: STRATA, MODEL, THREADS,
# INPUT_TOKENS, OUTPUT_TOKENS, CONCURRENCY="1 16 64"; ANALYZE_ONLY=1 reprints
# the table from OUT_DIR's files)
# Needs python3 for the arithmetic on the JSON reports.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-serve-bench-XXXXXX)}
mkdir -p "$OUT"
THREADS=${THREADS:-2}
INPUT_TOKENS=${INPUT_TOKENS:-128}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-32}
CONCURRENCY=${CONCURRENCY:-"1 16 64"}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi

if [ -z "${ANALYZE_ONLY:-}" ]; then
batches=$(echo $CONCURRENCY | tr ' ' ',')
echo "== engine alone: strata bench kernels (decode batches $batches, context $INPUT_TOKENS)" >&2
"$STRATA" bench kernels --model "$MODEL" --threads "$THREADS" --batches "$batches" --context "$INPUT_TOKENS" \
  --prefill "$INPUT_TOKENS" --iterations 3 --json > "$OUT/kernels.json" 2>/dev/null

PORTS="$OUT/ports.json"
rm -f "$PORTS"
"$STRATA" serve --model "$MODEL" --threads "$THREADS" --port 0 --grpc-port -1 --port-file "$PORTS" \
  --max-num-seqs 64 --log-level warn > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -f "$PORTS" ] && break; sleep 0.1; done
PORT=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" "$PORTS")
URL="http://127.0.0.1:$PORT"

for c in $CONCURRENCY; do
  n=$(( c < 8 ? 8 : (c < 32 ? 2 * c : c) ))
  echo "== concurrency $c: $n requests of $INPUT_TOKENS prompt + $OUTPUT_TOKENS output tokens" >&2
  curl -s "$URL/metrics" > "$OUT/metrics-before-$c.txt"
  # A distinct cache_salt per request: nothing is served from the prefix
  # cache, so the figures are compute, not cache hits.
  "$STRATA" bench run --url "$URL" --workload random --concurrency "$c" --requests "$n" --max-requests "$n" \
    --input-tokens "$INPUT_TOKENS" --output-tokens "$OUTPUT_TOKENS" --unique-cache-salt --seed "$c" \
    --no-plots --no-progress --scrape-interval 0 --out "$OUT/run-$c.json" > "$OUT/run-$c.txt" 2>&1
  curl -s "$URL/metrics" > "$OUT/metrics-after-$c.txt"
done
fi

python3 - "$OUT" "$INPUT_TOKENS" "$OUTPUT_TOKENS" $CONCURRENCY <<'EOF'
import json, re, sys
out, p_tok, o_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
levels = [int(x) for x in sys.argv[4:]]

def metric(text, name):
    m = re.search(r'^' + re.escape(name) + r'(\{[^}]*\})? ([0-9.eE+-]+)$', text, re.M)
    return float(m.group(2)) if m else 0.0

def delta_mean(c, base):
    before = open(f"{out}/metrics-before-{c}.txt").read()
    after = open(f"{out}/metrics-after-{c}.txt").read()
    s = metric(after, base + "_sum") - metric(before, base + "_sum")
    n = metric(after, base + "_count") - metric(before, base + "_count")
    return s / n if n else float("nan")

kern = json.load(open(f"{out}/kernels.json"))
engine_tps = {d["batch"]: d["tokens_per_s"] for d in kern["decode"]}
lim = kern["limits"]
print(f"machine: {lim['threads']} threads, read bandwidth {lim['read_bandwidth_gbs']:.1f} GB/s, "
      f"FMA peak {lim['fma_peak_gflops']:.0f} GFLOP/s; engine prefill {kern['prefill']['tokens_per_s']:.0f} tok/s")
hdr = ("conc", "reqs", "ttft_p50_ms", "client_ttft_ms", "engine_ttft_ms", "frontend_ms", "ttft_overhead_ms",
       "client_itl_ms", "engine_itl_ms", "itl_overhead_ms", "out_tok_s", "engine_decode_tok_s",
       "engine_bound_tok_s", "ratio")
print(" ".join(f"{h:>14}" for h in hdr))
rows = []
for c in levels:
    run = json.load(open(f"{out}/run-{c}.json"))
    s = run.get("summary", run)
    ttft = s.get("ttft_s", {})
    itl = s.get("itl_s", {})
    client_ttft = ttft.get("mean", float("nan")) * 1e3
    client_itl = itl.get("mean", float("nan")) * 1e3
    eng_ttft = delta_mean(c, "strata_time_to_first_token_seconds") * 1e3
    eng_itl = delta_mean(c, "strata_inter_token_latency_seconds") * 1e3
    front = delta_mean(c, "strata_request_frontend_time_seconds") * 1e3
    out_tps = s.get("output_token_throughput", float("nan"))
    eng = engine_tps.get(c, float("nan"))
    bound = o_tok / (p_tok / kern["prefill"]["tokens_per_s"] + o_tok / eng)
    row = (c, s.get("requests_ok", 0), ttft.get("p50", float("nan")) * 1e3, client_ttft, eng_ttft,
           front, client_ttft - eng_ttft, client_itl, eng_itl, client_itl - eng_itl, out_tps, eng, bound,
           out_tps / bound)
    rows.append(row)
    print(" ".join(f"{v:>14.2f}" if isinstance(v, float) else f"{v:>14}" for v in row))
json.dump([dict(zip(hdr, r)) for r in rows], open(f"{out}/serve_bench.json", "w"), indent=1)
print(f"(reports in {out})")
EOF
