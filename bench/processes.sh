# Sourced by the bench scripts that start Strata processes (bash).
# port_of FILE [KEY]: waits for a port file and prints its KEY ("http").
# PIDS: processes started; cleanup (an EXIT trap) stops them with SIGTERM.
# Sourced after OUT is set: port files an earlier run left in OUT are
# removed (port_of would read the dead processes' ports).
port_of() {
  for _ in $(seq 1 600); do [ -s "$1" ] && break; sleep 0.1; done
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "${2:-http}"
}
if [ -n "${OUT:-}" ]; then rm -f "$OUT"/*.port; fi
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
