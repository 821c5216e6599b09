#!/usr/bin/env bash
# Installs dependencies, builds Strata and runs it on the default model: a small
# synthetic model with RANDOM weights (written once to ~/.cache/strata), so
# nothing is downloaded. Pass --model PATH to use a real GGUF file or Hugging
# Face directory instead; any other arguments go to `strata generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build strata
if [ $# -eq 0 ]; then
  set -- --prompt "Once upon a time" --max-tokens 32
fi
exec ./build/tools/strata generate "$@"
