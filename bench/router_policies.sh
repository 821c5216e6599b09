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
# The cost model is calibrated first, on this machine (`strata bench
# calibrate --threads 1`, as each member runs), and each member starts with
# it (`--calibration`; the slow one's times SLOW).
#
# SIMULATE=1 also runs the same configuration in `strata bench simulate`
# (issue 20, "simulator vs live"): each round's requests become a small trace (Poisson arrivals at RATE,
# one unique hash id per request, real lengths) that the live run replays
# at its timestamps and the simulator replays with the same roles, the
# same slower prefill instance and the same policy. Its costs: the
# calibration times the slowdown the normal prefill instance showed in that
# live run (forward seconds ÷ the calibration's prediction for the same
# steps: on 2 cores the members, router and client slow each other, which
# the simulator does not model); the run with the plain calibration is
# printed beside it. Prints live and simulated TTFT p50 and goodput per
# run, simulated ÷ live, and whether the median of each over the rounds is
# within TOLERANCE.
#
# Usage: bench/router_policies.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (bench-110m q8_0 synthesised into
#   OUT_DIR), SLOW (3), ROUNDS (3), POLICIES ("ttft round-robin
#   least-loaded"), REQUESTS (40), INPUT_TOKENS (384), OUTPUT_TOKENS (8),
#   RATE (open loop, requests/s; default 1.2), ROUTER_SLO (the +slo
#   routers' --slo, default ttft=1s), SLO (goodput limits of the bench,
#   default ttft=2s), DEVICE_BYTES (each member's device KV pool, 256M),
#   SIMULATE (0), TOLERANCE (0.25), TRANSFER (the simulated handoff's
#   bytes/s, 2G: loopback TCP, an assumption; a 384-token handoff is 14 MB).
# Exit status: 0 when ttft has the lowest p90 TTFT of the policies without
# +slo in every round (and, with ttft+slo, ttft+slo the higher goodput;
# with SIMULATE=1, every simulated median within TOLERANCE of live),
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
DEVICE_BYTES=${DEVICE_BYTES:-256M}
SIMULATE=${SIMULATE:-0}
TOLERANCE=${TOLERANCE:-0.25}
TRANSFER=${TRANSFER:-2G}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi
echo "router policies: prefill-0 normal, prefill-1 ${SLOW}x slower, 1 decode; $REQUESTS requests of $INPUT_TOKENS tokens at $RATE/s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Before any member runs: the costs of one thread on a quiet machine. Each
# member starts with its calibration (`--calibration`), as a deployment's
# instances do: the slow one's is these costs times SLOW, what calibrating
# on a machine SLOW times slower would give. Live step rates replace them
# once each member has run prefills.
"$STRATA" bench calibrate --model "$MODEL" --threads 1 --out "$OUT/costs.json" > /dev/null 2> "$OUT/calibrate.log"
tail -1 "$OUT/calibrate.log" >&2
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); json.dump({k: v * float(sys.argv[3]) for k, v in c.items() if k in 'abcdef'}, open(sys.argv[2], 'w'))" \
  "$OUT/costs.json" "$OUT/costs-slow.json" "$SLOW"
if [ "$SIMULATE" = 1 ]; then
  for r in $(seq 1 "$ROUNDS"); do
    python3 - "$OUT/r$r.trace.jsonl" "$r" "$REQUESTS" "$RATE" "$INPUT_TOKENS" "$OUTPUT_TOKENS" <<'PY'
import json, random, sys
path, r, n, rate, inp, outp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng, t = random.Random(r), 0.0
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": int(t * 1000), "input_length": inp, "output_length": outp,
                            "hash_ids": [r * 1000000 + i]}) + "\n")
        t += rng.expovariate(rate)
PY
  done
fi

source bench/processes.sh
source bench/sim_instance.sh

"$STRATA" meta --port 0 --port-file "$OUT/meta.port" > "$OUT/meta.log" 2>&1 &
PIDS+=($!)
META="strata://127.0.0.1:$(port_of "$OUT/meta.port")"
member() {  # name role extra...
  local name=$1 role=$2
  shift 2
  "$STRATA" serve --model "$MODEL" --threads 1 --port 0 --grpc-port -1 --port-file "$OUT/$name.port" \
    --metadata "$META" --instance-name "$name" --role "$role" --metadata-lease-seconds 2 \
    --kv-device-bytes "$DEVICE_BYTES" --log-level warn "$@" \
    > "$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}
member prefill-0 prefill --calibration "$OUT/costs.json"
member prefill-1 prefill --debug-step-time-factor "$SLOW" --calibration "$OUT/costs-slow.json"
member decode-0 decode --calibration "$OUT/costs.json"
for n in prefill-0 prefill-1 decode-0; do port_of "$OUT/$n.port" > /dev/null; done

run() {  # round policy[+slo]
  local round=$1 policy=${2%+slo} tag="r$1-$2"
  local extra=()
  [ "$2" != "$policy" ] && extra=(--slo "$ROUTER_SLO")
  rm -f "$OUT/$tag.router.port"
  "$STRATA" router --model "$MODEL" --metadata "$META" --routing "$policy" --port 0 --grpc-port -1 \
    --port-file "$OUT/$tag.router.port" --log-level "${ROUTER_LOG_LEVEL:-warn}" "${extra[@]}" > "$OUT/$tag.router.log" 2>&1 &
  local router=$!
  local port
  port=$(port_of "$OUT/$tag.router.port")
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$port/metrics" | grep -q '^strata_router_instances{role="prefill"} 2' && break
    sleep 0.1
  done
  local workload=(--workload random --requests "$REQUESTS" --input-tokens "$INPUT_TOKENS"
    --output-tokens "$OUTPUT_TOKENS" --rate "$RATE" --seed "$round")
  [ "$SIMULATE" = 1 ] && workload=(--workload "trace:$OUT/r$round.trace.jsonl" --tokens-per-hash-id 0)
  if [ "$SIMULATE" = 1 ]; then
    curl -s "http://127.0.0.1:$(port_of "$OUT/prefill-0.port")/metrics" > "$OUT/$tag.prefill-0.before"
  fi
  # A different cache salt on every request: no run finds another's KV.
  "$STRATA" bench run --url "http://127.0.0.1:$port" "${workload[@]}" \
    --slo "$SLO" --unique-cache-salt --no-plots --no-progress --scrape-interval 0 --out "$OUT/$tag.json" \
    > "$OUT/$tag.txt" 2>&1
  if [ "$SIMULATE" = 1 ]; then
    curl -s "http://127.0.0.1:$(port_of "$OUT/prefill-0.port")/metrics" > "$OUT/$tag.prefill-0.after"
  fi
  if [ "$SIMULATE" = 1 ] && [ "$2" = "$policy" ]; then
    simulate "$tag" "$OUT/r$round.trace.jsonl" "$policy"
  fi
  curl -s "http://127.0.0.1:$port/metrics" > "$OUT/$tag.metrics"
  kill -TERM $router
  wait $router 2>/dev/null || true
}

# The simulated cluster: the members above, in virtual time, with the
# costs in file $1.
cluster_yaml() {
  cat <<YAML
instances: 3
roles:
  prefill: 2
  transfer_bytes_per_s: $TRANSFER
  transfer_latency_us: 1000
slower:
  instances: 1
  factor: $SLOW
  role: prefill
YAML
  sim_instance_yaml "$DEVICE_BYTES" "$1"
}

# simulate TAG TRACE POLICY: the run TAG simulated twice. "quiet": the
# costs calibrated before the members started. "in-run": those costs times
# the slowdown prefill-0 (the normal prefill instance) showed during the
# live run: its forward seconds ÷ what the calibration predicts for the
# same steps and prompts (the members, the router and the client share
# the 2 cores; calibration ran alone).
simulate() {
  local tag=$1 trace=$2 policy=$3
  python3 - "$OUT" "$tag" "$INPUT_TOKENS" <<'PY'
import json, re, sys
out, tag, prompt_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
def scrape(when):
    text = open(f"{out}/{tag}.prefill-0.{when}").read()
    def get(name, label=""):
        m = re.search(r'^' + name + r'\{[^}]*' + label + r'[^}]*\} ([0-9.eE+-]+)$', text, re.M)
        return float(m.group(1)) if m else 0.0
    return {"forward": get("strata_engine_forward_seconds_total"), "steps": get("strata_engine_steps_total"),
            "tokens": get("strata_engine_step_tokens_total", 'kind="prefill"'),
            "prompts": get("strata_request_prompt_tokens_count")}
b, a = scrape("before"), scrape("after")
d = {k: a[k] - b[k] for k in a}
cost = json.load(open(f"{out}/costs.json"))
# Each prompt's chunks attend to prompt_len^2 / 2 positions in all.
predicted = d["steps"] * cost["a"] + d["tokens"] * cost["b"] + d["prompts"] * cost["c"] * prompt_len * prompt_len / 2
factor = d["forward"] / predicted if predicted > 0 else 1.0
json.dump({k: v * factor for k, v in cost.items() if k in "abcdef"}, open(f"{out}/{tag}.costs.json", "w"))
json.dump({"factor": factor, "forward_s": d["forward"], "predicted_s": predicted, "steps": d["steps"],
           "prompts": d["prompts"]}, open(f"{out}/{tag}.slowdown.json", "w"))
PY
  cluster_yaml costs.json > "$OUT/cluster.yaml"
  cluster_yaml "$tag.costs.json" > "$OUT/$tag.cluster.yaml"
  "$STRATA" bench simulate --trace "$trace" --cluster "$OUT/cluster.yaml" --routing "$policy" \
    --tokens-per-hash-id 0 --slo "$SLO" --json > "$OUT/$tag.sim-quiet.json"
  "$STRATA" bench simulate --trace "$trace" --cluster "$OUT/$tag.cluster.yaml" --routing "$policy" \
    --tokens-per-hash-id 0 --slo "$SLO" --json > "$OUT/$tag.sim.json"
}

for r in $(seq 1 "$ROUNDS"); do
  n=${#POLICIES[@]}
  for k in $(seq 0 $((n - 1))); do
    run "$r" "${POLICIES[$(((k + r - 1) % n))]}"
  done
done

SIMULATE=$SIMULATE TOLERANCE=$TOLERANCE python3 - "$OUT" "$ROUNDS" "${POLICIES[@]}" <<'PY'
import json, os, re, statistics, sys
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
if os.environ.get("SIMULATE") == "1":
    tol = float(os.environ["TOLERANCE"])
    print(f"\nsimulated / live (strata bench simulate with the in-run costs; within {tol:.0%} on the median of the rounds)")
    print(f"{'round':<6} {'policy':<15} {'slowdown':>8} {'TTFT p50 live':>13} {'sim':>7} {'ratio':>6} {'goodput live':>12} {'sim':>7} {'ratio':>6} "
          f"{'fast share sim':>14} {'quiet: TTFT ratio':>17} {'goodput ratio':>13}")
    for p in plain:
        rt, rg = [], []
        for r in range(1, rounds + 1):
            tag = f"r{r}-{p}"
            live = json.load(open(f"{out}/{tag}.json"))["summary"]
            sim = json.load(open(f"{out}/{tag}.sim.json"))
            by = sim.get("requests_by_instance", [])
            share = by[0] / max(1, by[0] + by[1]) if len(by) >= 2 else float("nan")
            t, g = sim["ttft_p50_s"] / live["ttft_s"]["p50"], sim["goodput_rps"] / max(1e-9, live["goodput_rps"])
            quiet = json.load(open(f"{out}/{tag}.sim-quiet.json"))
            qt, qg = quiet["ttft_p50_s"] / live["ttft_s"]["p50"], quiet["goodput_rps"] / max(1e-9, live["goodput_rps"])
            slow = json.load(open(f"{out}/{tag}.slowdown.json"))["factor"]
            rt.append(t)
            rg.append(g)
            print(f"{r:<6} {p:<15} {slow:>8.2f} {live['ttft_s']['p50']:>13.3f} {sim['ttft_p50_s']:>7.3f} {t:>6.2f} "
                  f"{live['goodput_rps']:>12.3f} {sim['goodput_rps']:>7.3f} {g:>6.2f} {share:>14.2f} {qt:>17.2f} {qg:>13.2f}")
        for name, v in (("TTFT p50", rt), ("goodput", rg)):
            m = statistics.median(v)
            ok = abs(m - 1) <= tol
            bad += not ok
            print(f"{p}: median {name} sim/live {m:.2f} " + ("within" if ok else "OUTSIDE") + f" {tol:.0%}")
sys.exit(3 if bad else 0)
PY
