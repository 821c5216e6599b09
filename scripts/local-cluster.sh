#!/usr/bin/env bash
# A prefill/decode cluster on this machine, in one command: `strata router`
# on http://127.0.0.1:8000 (OpenAI API; gRPC on 50051), which also serves
# the cluster metadata on strata://127.0.0.1:2389, in front of prefill and
# decode instances of one model, until Ctrl-C (then every process stops).
# Installs dependencies and builds first, as scripts/quickstart.sh does.
#
# Usage: bash scripts/local-cluster.sh [--model PATH] [--prefill N] [--decode N]
#          [--port P] [--grpc-port G] [--metadata-port M] [-- flags for every strata serve]
# Without --model: the synthetic default model (RANDOM weights). Clients talk
# to the router only; docs/disaggregation.md explains the pieces.
# With STRATA_BIN=/path/to/strata, that binary runs and the set-up is skipped
# (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."

model="" prefill=1 decode=1 port=8000 grpc=50051 meta=2389
serve_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --prefill) prefill="$2"; shift 2 ;;
    --decode) decode="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --grpc-port) grpc="$2"; shift 2 ;;
    --metadata-port) meta="$2"; shift 2 ;;
    --) shift; serve_extra=("$@"); break ;;
    *) echo "local-cluster.sh: unknown argument '$1' (see the top of this script)" >&2; exit 2 ;;
  esac
done

if [ -n "${STRATA_BIN:-}" ]; then
  bin="$STRATA_BIN"
else
  bash scripts/install-deps.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C build strata
  bin=./build/tools/strata
fi
url="strata://127.0.0.1:${meta}"
model_args=()
[ -n "$model" ] && model_args=(--model "$model")

pids=()
stop_all() {
  trap - EXIT INT TERM
  [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
}
trap stop_all EXIT INT TERM

"$bin" router "${model_args[@]}" --metadata "$url" --serve-metadata --port "$port" --grpc-port "$grpc" &
pids+=($!)
# The instances register in the router's metadata store: wait for it.
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/${meta}") 2>/dev/null && break
  sleep 0.1
done
start_instance() {  # role name
  "$bin" serve "${model_args[@]}" --role "$1" --instance-name "$2" --metadata "$url" --port 0 --grpc-port -1 \
    "${serve_extra[@]}" &
  pids+=($!)
}
for i in $(seq 1 "$prefill"); do start_instance prefill "prefill-$i"; done
for i in $(seq 1 "$decode"); do start_instance decode "decode-$i"; done
echo "local-cluster: router on http://127.0.0.1:${port} (gRPC ${grpc}), ${prefill} prefill + ${decode} decode instances; Ctrl-C stops them" >&2
# Any process that exits ends the cluster.
wait -n
