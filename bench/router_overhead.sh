#!/usr/bin/env bash
# What the router and the handoff cost on a cached prompt (issue 20): time
# to first token of the same long prompt, asked again and again (so all but
# its last block is cached), straight to a `strata serve --role both`
# instance, and through `strata router` in front of a prefill and a decode
# instance; and through a second router that reserves before it prefills
# (`--reserve-beside-prefill false`, the order before 2026-12-05), both
# routers in front of the same instances. ROUNDS alternating rounds (the
# order rotates every round); each round sends REQUESTS requests one at a
# time to each and takes the median TTFT. Prints, per round, each median
# and routed ÷ direct for both routers.
#
# Usage: bench/router_overhead.sh [OUT_DIR]
#   env: STRATA (build/tools/strata), MODEL (bench-110m q8_0 synthesised
#   into OUT_DIR), ROUNDS (5), REQUESTS (20), PROMPT_TOKENS (384),
#   THREADS (1 per instance).
# Exit status 0; non-zero on a failure. Needs python3 and curl.
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-router-overhead-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-20}
PROMPT_TOKENS=${PROMPT_TOKENS:-384}
THREADS=${THREADS:-1}
MODEL=${MODEL:-$OUT/bench-110m-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset bench-110m --dtype q8_0 --out "$MODEL" >/dev/null 2>&1
fi

source bench/processes.sh

"$STRATA" meta --port 0 --port-file "$OUT/meta.port" > "$OUT/meta.log" 2>&1 &
PIDS+=($!)
META="strata://127.0.0.1:$(port_of "$OUT/meta.port")"
serve() {  # name args...
  local name=$1
  shift
  "$STRATA" serve --model "$MODEL" --threads "$THREADS" --port 0 --grpc-port -1 --port-file "$OUT/$name.port" \
    --log-level warn "$@" > "$OUT/$name.log" 2>&1 &
  PIDS+=($!)
}
serve direct
serve prefill-0 --metadata "$META" --instance-name prefill-0 --role prefill
serve decode-0 --metadata "$META" --instance-name decode-0 --role decode
"$STRATA" router --model "$MODEL" --metadata "$META" --port 0 --grpc-port -1 --port-file "$OUT/router.port" \
  --log-level warn > "$OUT/router.log" 2>&1 &
PIDS+=($!)
"$STRATA" router --model "$MODEL" --metadata "$META" --port 0 --grpc-port -1 --port-file "$OUT/serial.port" \
  --reserve-beside-prefill false --log-level warn > "$OUT/serial.log" 2>&1 &
PIDS+=($!)
DIRECT=$(port_of "$OUT/direct.port")
ROUTER=$(port_of "$OUT/router.port")
SERIAL=$(port_of "$OUT/serial.port")
port_of "$OUT/prefill-0.port" > /dev/null
port_of "$OUT/decode-0.port" > /dev/null
for port in $ROUTER $SERIAL; do
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$port/metrics" | grep -q '^strata_router_instances{role="decode"} 1' && break
    sleep 0.1
  done
done

python3 - "$DIRECT" "$ROUTER" "$SERIAL" "$ROUNDS" "$REQUESTS" "$PROMPT_TOKENS" <<'PY'
import http.client, json, statistics, sys, time
direct, router, serial, rounds, requests, n = (int(a) for a in sys.argv[1:])
def ttft(port, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"port {port}: HTTP {r.status}: {r.read()[:200]}")
    first = None
    for line in r:
        if first is None and line.startswith(b"data: {"):
            first = time.perf_counter() - t0
    c.close()
    return first
prompt = [5 + (i * 37) % 20000 for i in range(n)]
for port in (direct, router, serial):  # warm the caches (and the decode instance's)
    ttft(port, prompt)
    ttft(port, prompt)
ratios, serial_ratios = [], []
print(f"{'round':<6} {'direct ms':>10} {'router ms':>10} {'serial ms':>10} {'router/direct':>14} {'serial/direct':>14}")
for r in range(rounds):
    ports = [direct, router, serial]
    order = ports[r % 3:] + ports[:r % 3]
    if r % 2 == 1:
        order.reverse()
    med = {}
    for port in order:
        med[port] = statistics.median(ttft(port, prompt) for _ in range(requests))
    ratios.append(med[router] / med[direct])
    serial_ratios.append(med[serial] / med[direct])
    print(f"{r + 1:<6} {1e3 * med[direct]:>10.2f} {1e3 * med[router]:>10.2f} {1e3 * med[serial]:>10.2f} "
          f"{ratios[-1]:>14.3f} {serial_ratios[-1]:>14.3f}")
print(f"median router/direct over {rounds} rounds: {statistics.median(ratios):.3f} (issue 20 goal: at most 1.05); "
      f"reserving first: {statistics.median(serial_ratios):.3f}")
PY
