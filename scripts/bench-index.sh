#!/usr/bin/env bash
# The index benchmark: replays the bundled Mooncake conversation trace (16 workers, expand 4)
# through the KV index and prints the figures (BENCHMARKS.md). Extra arguments go to kvr-bench,
# e.g. --index ckf, --readers 1, --repeat 9.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
ops=build/data/conv_x4.ops.jsonl
if [ ! -s "$ops" ]; then
  mkdir -p build/data
  echo "generating the op stream (Mooncake conversation trace, 16 workers, expand 4) ..."
  /usr/bin/python3 tools/kvtrace.py gen --trace data/traces/mooncake_fast25_conversation_trace.jsonl.gz \
    --workers 16 --capacity 16384 --expand 4 --block-size 16 --assign random > "$ops.tmp"
  mv "$ops.tmp" "$ops"
fi
exec build/bin/kvr-bench index "$ops" --repeat 5 "$@"
