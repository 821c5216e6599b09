#!/usr/bin/env bash
# Front-door benchmark (issue 16): does a flood of huge requests stall small
# ones? Starts `strata serve` on a model, then measures, idle and during a
# flood of FLOOD concurrent BIG_MIB-MiB chat requests (sent again as each
# finishes), the latency of GET /health (p50, p99) and the time to first
# token of a small streamed chat (median). Prints each next to its idle
# baseline measured in the same run, as a ratio. Goals: /health p99 <= 50 ms
# and small-chat TTFT <= 2x idle during the flood.
#
# Usage: bench/front_door_bench.sh [OUT_DIR]   (env: STRATA, MODEL (default:
# the tiny synthetic model), FLOOD=8, BIG_MIB=12, IDLE_SECONDS=3,
# FLOOD_SECONDS=15: how long each phase probes, /health every ~5 ms and a
# small chat every tenth probe)
set -euo pipefail
cd "$(dirname "$0")/.."
STRATA=${STRATA:-build/tools/strata}
OUT=${1:-$(mktemp -d /tmp/strata-front-door-XXXXXX)}
mkdir -p "$OUT"
FLOOD=${FLOOD:-8}
BIG_MIB=${BIG_MIB:-12}
IDLE_SECONDS=${IDLE_SECONDS:-3}
FLOOD_SECONDS=${FLOOD_SECONDS:-15}
MODEL=${MODEL:-$OUT/tiny.gguf}
if [ ! -f "$MODEL" ]; then
  "$STRATA" model synth --preset tiny --dtype f32 --out "$MODEL" >/dev/null 2>&1
fi
PORTS="$OUT/ports.json"
rm -f "$PORTS"
"$STRATA" serve --model "$MODEL" --served-model-name m --threads 1 --port 0 --grpc-port -1 --port-file "$PORTS" \
  --log-level warn > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -f "$PORTS" ] && break; sleep 0.1; done
PORT=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http'])" "$PORTS")

python3 - "$PORT" "$FLOOD" "$BIG_MIB" "$IDLE_SECONDS" "$FLOOD_SECONDS" <<'EOF'
import http.client, json, statistics, sys, threading, time
port, flood, big_mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
idle_s, flood_s = float(sys.argv[4]), float(sys.argv[5])

def health_s():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t = time.perf_counter()
    c.request("GET", "/health")
    r = c.getresponse(); r.read()
    c.close()
    assert r.status == 200, r.status
    return time.perf_counter() - t

SMALL = json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                    "messages": [{"role": "user", "content": "Hello there"}]})
def small_ttft_s():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", SMALL, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    first = None
    while True:
        line = r.fp.readline()
        if not line or line.startswith(b"data: [DONE]"): break
        if first is None and line.startswith(b"data: {") and b'"content"' in line and b'"content":""' not in line:
            first = time.perf_counter() - t
    c.close()
    return first if first is not None else time.perf_counter() - t

words = ["the ", "little ", "cat ", "sat ", "on ", "a ", "warm ", "mat ", "and ", "slept. "]
text = "".join(words[(i * 7 + i // 3) % 10] for i in range(big_mib * (1 << 20) // 5))[: big_mib << 20]
BIG = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}).encode()
stop = threading.Event()
big_done = [0]
def flooder():
    while not stop.is_set():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/chat/completions", BIG, {"Content-Type": "application/json"})
        c.getresponse().read()
        c.close()
        big_done[0] += 1

def measure(seconds):
    h, t = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        h.append(health_s())
        if len(h) % 10 == 0: t.append(small_ttft_s())
        time.sleep(0.005)
    return h, t

def p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

idle_h, idle_t = measure(idle_s)
threads = [threading.Thread(target=flooder, daemon=True) for _ in range(flood)]
for th in threads: th.start()
time.sleep(1.0)  # the flood is being read and tokenized
t0 = time.perf_counter()
flood_h, flood_t = measure(flood_s)
span = time.perf_counter() - t0
stop.set()
ms = lambda s: s * 1e3
print(f"flood: {flood} concurrent {big_mib} MiB chats (re-sent as each finishes; {big_done[0]} finished during "
      f"{span:.1f} s of probes); idle: {len(idle_h)} /health probes, {len(idle_t)} small streamed chats; "
      f"flood: {len(flood_h)} and {len(flood_t)}")
print(f"{'figure':34s} {'idle':>10s} {'flood':>10s} {'flood/idle':>10s} {'goal':>14s}")
rows = [("/health p50 ms", ms(p(idle_h, .5)), ms(p(flood_h, .5)), ""),
        ("/health p99 ms", ms(p(idle_h, .99)), ms(p(flood_h, .99)), "<= 50 ms"),
        ("small chat TTFT median ms", ms(statistics.median(idle_t)), ms(statistics.median(flood_t)), "<= 2x idle")]
for name, a, b, goal in rows:
    print(f"{name:34s} {a:10.2f} {b:10.2f} {b / a if a > 0 else float('nan'):10.2f} {goal:>14s}")
EOF
