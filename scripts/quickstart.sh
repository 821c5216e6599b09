#!/usr/bin/env bash
# Installs dependencies, builds Strata and serves the default model on
# http://127.0.0.1:8000 (OpenAI API) and 127.0.0.1:50051 (gRPC) until Ctrl-C:
# a small synthetic model with RANDOM weights (written once to
# ~/.cache/strata), so nothing is downloaded. Pass --model PATH to serve a
# real GGUF file or Hugging Face directory instead; any other arguments go to
# `strata serve` (see docs/cli.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build strata
exec ./build/tools/strata serve "$@"
