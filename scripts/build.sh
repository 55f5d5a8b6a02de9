#!/usr/bin/env bash
# Configures and builds one flavour of kvrouter: release (default), asan (ASan+UBSan) or tsan.
#   scripts/build.sh [release|asan|tsan]      -> build/ , build-asan/ , build-tsan/
# The compiler output goes to <dir>/build.log and is shown only when the build fails
# (KVR_VERBOSE=1 shows it always).
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
case "$flavour" in
  release) dir=build;      args=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan)    dir=build-asan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_ASAN=ON) ;;
  tsan)    dir=build-tsan; args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_TSAN=ON) ;;
  *) echo "usage: $0 [release|asan|tsan]" >&2; exit 2 ;;
esac
mkdir -p "$dir"
echo "build ($flavour): $dir/"
if [ "${KVR_VERBOSE:-0}" = 1 ]; then
  cmake -S . -B "$dir" "${args[@]}"
  cmake --build "$dir" -j"$(nproc)"
elif ! { cmake -S . -B "$dir" "${args[@]}" && cmake --build "$dir" -j"$(nproc)"; } > "$dir/build.log" 2>&1; then
  cat "$dir/build.log"
  echo "build ($flavour) failed" >&2
  exit 1
fi
