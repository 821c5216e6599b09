#!/usr/bin/env bash
# Routing policies on unequal instances, live (issue 20): two prefill
# instances, one made SLOW times slower per step by the test-only
# `--debug-step-time-factor` (thread counts cannot make instances differ
# reliably on a 2-core machine), and one decode instance, registered in a
# `strata meta` store. For each of ROUNDS rounds, a router is started with
# each policy in turn (the order rotates every round, so no policy always
# runs first or last) and `strata bench run` sends the same workload
# through it. Prints, per run, TTFT p50/p90, goodput and the share of
# prefills each instance got; then, per round, p90 TTFT of ttft ÷ each
# other policy (below 1 = ttft is better).
#
# A policy written POLICY+slo runs that router with `--slo $ROUTER_SLO`
# (early refusal); with both ttft and ttft+slo in POLICIES the rounds also
# compare their goodput (requests meeting SLO per second) and print the
# median observed ÷ predicted TTFT. E.g. admission under overload:
#   POLICIES="ttft ttft+slo" ROUTER_SLO=ttft=1s SLO=ttft=1s RATE=2.5 bench/router_policies.sh
#
# Usage: bench/router_policies.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (bench-110m q8_0 synthesised into
#   OUT_DIR), SLOW (3), ROUNDS (3), POLICIES ("ttft round-robin
#   least-loaded"), REQUESTS (40), INPUT_TOKENS (384), OUTPUT_TOKENS (8),
#   RATE (open loop, requests/s; default 1.2), ROUTER_SLO (the +slo
#   routers' --slo, default ttft=1s), SLO (goodput limits of the bench,
#   default ttft=2s).
# Exit status: 0 when ttft has the lowest p90 TTFT of the policies without
# +slo in every round (and, with ttft+slo, ttft+slo the higher goodput),
# 3 when not, other non-zero on a failure. Needs python3 and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-router-policies-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SLOW=${SLOW:-3}
ROUNDS=${ROUNDS:-3}
POLICIES=(${POLICIES:-ttft round-robin least-loaded})
REQUESTS=${REQUESTS:-40}
INPUT_TOKENS=${INPUT_TOKENS:-384}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-8}
RATE=${RATE:-1.2}
ROUTER_SLO=${ROUTER_SLO:-ttft=1s}
SLO=${SLO:-ttft=2s}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi
echo "router policies: prefill-0 normal, prefill-1 ${SLOW}x slower, 1 decode; $REQUESTS requests of $INPUT_TOKENS tokens at $RATE/s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

source bench/processes.sh

"$STRATA" meta --port 0 --port-file "$OUT/meta.port" > "$OUT/meta.log" 2>&1 &
PIDS+=($!)
META="strata://127.0.0.1:$(port_of "$OUT/meta.port")"
member() {  # name role extra...
  local name=$1 role=$2
  shift 2
  "$STRATA" serve --model "$MODEL" --threads 1 --port 0 --grpc-port -1 --port-file "$OUT/$name.port" \
    --metadata "$META" --instance-name "$name" --role "$role" --metadata-lease-seconds 2 --log-level warn "$@" \
    > "$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}
member prefill-0 prefill
member prefill-1 prefill --debug-step-time-factor "$SLOW"
member decode-0 decode
for n in prefill-0 prefill-1 decode-0; do port_of "$OUT/$n.port" > /dev/null; done

run() {  # round policy[+slo]
  local round=$1 policy=${2%+slo} tag="r$1-$2"
  local extra=()
  [ "$2" != "$policy" ] && extra=(--slo "$ROUTER_SLO")
  rm -f "$OUT/$tag.router.port"
  "$STRATA" router --model "$MODEL" --metadata "$META" --routing "$policy" --port 0 --grpc-port -1 \
    --port-file "$OUT/$tag.router.port" --log-level warn "${extra[@]}" > "$OUT/$tag.router.log" 2>&1 &
  local router=$!
  local port
  port=$(port_of "$OUT/$tag.router.port")
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$port/metrics" | grep -q '^strata_router_instances{role="prefill"} 2' && break
    sleep 0.1
  done
  # A different cache salt on every request: no run finds another's KV.
  "$STRATA" bench run --url "http://127.0.0.1:$port" --workload random --requests "$REQUESTS" \
    --input-tokens "$INPUT_TOKENS" --output-tokens "$OUTPUT_TOKENS" --rate "$RATE" --seed "$round" \
    --slo "$SLO" --unique-cache-salt --no-plots --no-progress --scrape-interval 0 --out "$OUT/$tag.json" \
    > "$OUT/$tag.txt" 2>&1
  curl -s "http://127.0.0.1:$port/metrics" > "$OUT/$tag.metrics"
  kill -TERM $router
  wait $router 2>/dev/null || true
}

for r in $(seq 1 "$ROUNDS"); do
  n=${#POLICIES[@]}
  for k in $(seq 0 $((n - 1))); do
    run "$r" "${POLICIES[$(((k + r - 1) % n))]}"
  done
done

python3 - "$OUT" "$ROUNDS" "${POLICIES[@]}" <<'PY'
import json, re, sys
out, rounds, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def routed(tag, inst):
    m = re.search(r'^strata_router_routed_total\{phase="prefill",instance="' + inst + r'"\} (\d+)',
                  open(f"{out}/{tag}.metrics").read(), re.M)
    return int(m.group(1)) if m else 0
def refused(tag):
    return sum(int(v) for v in re.findall(r'^strata_router_refused_total\{[^}]*\} (\d+)', open(f"{out}/{tag}.metrics").read(), re.M))
print(f"{'round':<6} {'policy':<15} {'ok':>4} {'refused':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'goodput/s':>9} {'fast share':>10}")
p90 = {}
for r in range(1, rounds + 1):
    for p in policies:
        tag = f"r{r}-{p}"
        s = json.load(open(f"{out}/{tag}.json"))["summary"]
        fast, slow = routed(tag, "prefill-0"), routed(tag, "prefill-1")
        p90[(r, p)] = s["ttft_s"]["p90"]
        print(f"{r:<6} {p:<15} {s['requests_ok']:>4} {refused(tag):>7} {s['ttft_s']['p50']:>9.3f} {s['ttft_s']['p90']:>9.3f} "
              f"{s['goodput_rps']:>9.3f} {fast / max(1, fast + slow):>10.2f}")
bad = 0
plain = [p for p in policies if not p.endswith("+slo")]
if "ttft" in plain and len(plain) > 1:
    print("\np90 TTFT, ttft / other (below 1: ttft better)")
    for r in range(1, rounds + 1):
        cells = []
        for p in plain:
            if p == "ttft":
                continue
            ratio = p90[(r, "ttft")] / p90[(r, p)] if p90[(r, p)] else float("nan")
            bad += not ratio < 1
            cells.append(f"{p} {ratio:.2f}")
        print(f"round {r}: " + ", ".join(cells))
def ratio_median(tag):
    # The median bucket of strata_router_ttft_prediction_ratio (observed / predicted).
    text = open(f"{out}/{tag}.metrics").read()
    b = [(float(le) if le != "+Inf" else float("inf"), int(n)) for le, n in
         re.findall(r'^strata_router_ttft_prediction_ratio_bucket\{le="([^"]+)"\} (\d+)', text, re.M)]
    if not b or b[-1][1] == 0:
        return None, 0
    half = b[-1][1] / 2
    lower = 0.0
    for le, n in b:
        if n >= half:
            return (lower, le), b[-1][1]
        lower = le
    return None, 0
if "ttft" in policies and "ttft+slo" in policies:
    print("\nadmission: goodput with early refusal / without (above 1: refusing pays)")
    for r in range(1, rounds + 1):
        g = {p: json.load(open(f"{out}/r{r}-{p}.json"))["summary"]["goodput_rps"] for p in ("ttft", "ttft+slo")}
        ratio = g["ttft+slo"] / g["ttft"] if g["ttft"] else float("inf")
        bad += not ratio > 1
        print(f"round {r}: {g['ttft+slo']:.3f} / {g['ttft']:.3f} = {ratio:.2f}")
if "ttft" in policies:
    print("\nobserved / predicted TTFT, median bucket (strata_router_ttft_prediction_ratio)")
    for r in range(1, rounds + 1):
        for p in policies:
            if p.startswith("ttft"):
                m, n = ratio_median(f"r{r}-{p}")
                print(f"round {r} {p}: " + (f"({m[0]:g}, {m[1]:g}] of {n} predictions" if m else "no predictions"))
sys.exit(3 if bad else 0)
PY
