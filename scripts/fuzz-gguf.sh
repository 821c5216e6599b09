#!/usr/bin/env bash
# Fuzzes the GGUF reader/writer with libFuzzer (+ AddressSanitizer and UBSan).
#
#   scripts/fuzz-gguf.sh [SECONDS]      (default 600)
#
# Builds build-fuzz/gguf/gguf_fuzz with clang++ straight from the few sources
# the parser needs, seeds a working corpus from tests/fuzz/corpus/gguf plus
# valid files written by GgufWriter (and, when present, the start of
# $STRATA_SHARED_DIR/models/stories260K.gguf, which is not committed), fuzzes
# for SECONDS on one core, then re-minimizes the committed corpus: the result
# is the smallest set of files covering everything the old corpus and the new
# inputs covered. Crashes go to build-fuzz/gguf/artifacts/ and make the script
# exit non-zero.
#
# Environment: CXX_FUZZ (default clang++), STRATA_SHARED_DIR (default ../shared).
set -euo pipefail

SECS="${1:-600}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/build-fuzz/gguf"
CORPUS="$ROOT/tests/fuzz/corpus/gguf"
SHARED="${STRATA_SHARED_DIR:-$ROOT/../shared}"
CXX="${CXX_FUZZ:-clang++}"
MAX_LEN=65536
# The committed corpus is merged with a smaller limit (longer inputs are cut)
# so it stays well under 2 MB; GGUF structure rarely needs more.
COMMIT_MAX_LEN="${COMMIT_MAX_LEN:-16384}"

SRCS=(model/gguf.cc model/gguf_writer.cc model/backend/dtype.cc
      common/status.cc common/mapped_file.cc)
FLAGS=(-std=c++2b -g -O1 -fno-omit-frame-pointer -I"$ROOT"
       -fno-sanitize-recover=undefined)

if ! command -v "$CXX" >/dev/null; then
  echo "fuzz-gguf: $CXX not found; run scripts/install-deps.sh" >&2
  exit 2
fi
mkdir -p "$OUT/artifacts" "$CORPUS"
cd "$ROOT"

echo "fuzz-gguf: building with $CXX"
"$CXX" "${FLAGS[@]}" -fsanitize=fuzzer,address,undefined \
  tests/fuzz/gguf_fuzz.cc "${SRCS[@]}" -o "$OUT/gguf_fuzz"
# Same checks without libFuzzer's main: writes the seed files.
"$CXX" "${FLAGS[@]}" -fsanitize=address,undefined \
  tests/fuzz/gguf_fuzz.cc tests/fuzz/gguf_replay_main.cc "${SRCS[@]}" -o "$OUT/gguf_replay"

rm -rf "$OUT/seeds" "$OUT/minimized"
mkdir -p "$OUT/seeds" "$OUT/work" "$OUT/minimized"
MODEL="$SHARED/models/stories260K.gguf"
if [ -f "$MODEL" ]; then
  "$OUT/gguf_replay" --write-seeds "$OUT/seeds" "$MODEL"
  head -c "$MAX_LEN" "$MODEL" > "$OUT/seeds/stories260K_head.gguf"
else
  echo "fuzz-gguf: $MODEL not found; seeding without it" >&2
  "$OUT/gguf_replay" --write-seeds "$OUT/seeds"
fi

# New inputs land in the first directory ($OUT/work, kept between runs).
echo "fuzz-gguf: fuzzing for ${SECS}s"
status=0
"$OUT/gguf_fuzz" "$OUT/work" "$CORPUS" "$OUT/seeds" \
  -max_len="$MAX_LEN" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$OUT/artifacts/" 2>&1 | tee "$OUT/fuzz.log" ||
  status=$?

# Re-minimize: keep only inputs that add coverage, committed corpus first.
echo "fuzz-gguf: merging into $CORPUS"
"$OUT/gguf_fuzz" -merge=1 -max_len="$COMMIT_MAX_LEN" "$OUT/minimized" "$CORPUS" "$OUT/seeds" "$OUT/work" \
  > "$OUT/merge.log" 2>&1
find "$CORPUS" -maxdepth 1 -type f -delete
cp "$OUT/minimized"/* "$CORPUS"/
bytes=$(find "$CORPUS" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "fuzz-gguf: corpus now $(find "$CORPUS" -type f | wc -l) files, $bytes bytes"
if [ "$bytes" -gt 2000000 ]; then
  echo "fuzz-gguf: corpus over 2 MB; rerun with a smaller COMMIT_MAX_LEN" >&2
fi
grep -E "^(stat::|Done|#[0-9]+.*DONE)" "$OUT/fuzz.log" || true
if [ "$status" -ne 0 ]; then
  echo "fuzz-gguf: the fuzzer failed (exit $status); see $OUT/artifacts/ and $OUT/fuzz.log" >&2
fi
exit "$status"
