#!/usr/bin/env bash
# ckf_opstream.sh - replays the Mooncake conversation op stream (spec/opstream.md, default
# options: 16 workers, capacity 16384) through the CKF index mode, in canonical and translated
# mode, and checks the acceptance bar: 0 undercounting queries, <= 0.1% overcounting queries,
# <= 3 bytes per stored block.
#   usage: ckf_opstream.sh <source dir> <build dir>
set -euo pipefail
src=$1
build=$2
py=/usr/bin/python3
if ! "$py" -c 'import xxhash' 2>/dev/null; then
  echo "ckf_opstream: $py lacks the xxhash module (scripts/setup.sh installs python3-xxhash)" >&2
  exit 1
fi
ops=$build/data/conv.ops.jsonl
if [ ! -s "$ops" ]; then
  mkdir -p "$build/data"
  # a temp name of our own: opstream_gen_conv writes $ops.tmp (CTest orders the two through
  # the "conv" fixture where both exist)
  "$py" "$src/tools/kvtrace.py" gen \
    --trace "$src/data/traces/mooncake_fast25_conversation_trace.jsonl.gz" > "$ops.tmp.$$"
  mv "$ops.tmp.$$" "$ops"
fi
"$build/bin/kvr-ckf-bench" replay "$ops" --expected 16384 --check
"$build/bin/kvr-ckf-bench" replay "$ops" --expected 16384 --translate --check
