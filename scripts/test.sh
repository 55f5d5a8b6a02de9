#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs every test.
#   scripts/test.sh            release build, all tests (the README's test command)
#   scripts/test.sh asan       the same suite under ASan+UBSan
#   scripts/test.sh tsan       the concurrency tests under TSan (label "concurrency")
#   scripts/test.sh valgrind   the server integration tests and a few unit suites under
#                              valgrind memcheck (label "valgrind"; build-valgrind/, RelWithDebInfo)
#   scripts/test.sh fuzz       a short libFuzzer run of every fuzz target (clang; build-fuzz/):
#                              KVR_FUZZ_SECONDS each (default 30); fails on any crash, leak,
#                              timeout or sanitizer report (artifacts kept in build-fuzz/artifacts)
# KVR_BUILD_DIR overrides the build directory of the valgrind and fuzz flavours.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
case "$flavour" in
  valgrind) export KVR_SETUP_EXTRA="${KVR_SETUP_EXTRA:-} valgrind" ;;
  fuzz) export KVR_SETUP_EXTRA="${KVR_SETUP_EXTRA:-} clang libclang-rt-14-dev" ;;
esac
scripts/setup.sh

# Configures and builds into $1 with the remaining cmake arguments; the output goes to
# $1/build.log, shown when the build fails (KVR_VERBOSE=1: always).
# BUILD_TARGETS (space-separated) limits what is built.
build_in() {
  local dir=$1
  shift
  local targets=()
  for x in ${BUILD_TARGETS:-}; do targets+=(--target "$x"); done
  mkdir -p "$dir"
  echo "build ($flavour): $dir/"
  if [ "${KVR_VERBOSE:-0}" = 1 ]; then
    cmake -S . -B "$dir" "$@" && cmake --build "$dir" -j"$(nproc)" "${targets[@]}"
  elif ! { cmake -S . -B "$dir" "$@" &&
           cmake --build "$dir" -j"$(nproc)" "${targets[@]}"; } > "$dir/build.log" 2>&1; then
    cat "$dir/build.log"
    echo "build ($flavour) failed" >&2
    exit 1
  fi
}

case "$flavour" in
  release | asan | tsan)
    scripts/build.sh "$flavour"
    dir=build
    [ "$flavour" = release ] || dir=build-$flavour
    ctest_args=(--output-on-failure -j2)
    [ "$flavour" = tsan ] && ctest_args+=(-L concurrency)
    (cd "$dir" && ctest "${ctest_args[@]}")
    ;;
  valgrind)
    dir=${KVR_BUILD_DIR:-build-valgrind}
    build_in "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_VALGRIND=ON
    # one test at a time: valgrind runs a program's threads one after the other, so the time
    # bounds (x KVR_TIME_SCALE) hold better without a second valgrind on the other core
    (cd "$dir" && ctest --output-on-failure -j1 -L valgrind)
    ;;
  fuzz)
    dir=${KVR_BUILD_DIR:-build-fuzz}
    targets=$(sed -n 's/^set(KVR_FUZZ_[A-Z]*_TARGETS \(.*\))$/\1/p' fuzz/CMakeLists.txt)
    BUILD_TARGETS=$(for t in $targets; do printf 'fuzz_%s ' "$t"; done) \
      build_in "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVR_FUZZ=ON -DCMAKE_C_COMPILER=clang
    secs=${KVR_FUZZ_SECONDS:-30}
    art="$dir/artifacts"
    rm -rf "$art" "$dir/work"
    mkdir -p "$art"
    failed=()
    for t in $targets; do
      bin="$dir/fuzz/fuzz_$t"
      work="$dir/work/$t"
      mkdir -p "$work" "$art/$t"
      args=(-max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048
            -print_final_stats=1 -artifact_prefix="$art/$t/")
      case "$t" in
        http_json | http_body | event_json) args+=(-dict=fuzz/dict/json.dict) ;;
        config) args+=(-dict=fuzz/dict/config.dict) ;;
      esac
      # the in-process router keeps state between inputs: no per-input leak check there
      [ "$t" = http_body ] && args+=(-detect_leaks=0)
      echo "fuzz: $t for ${secs}s"
      if ! "$bin" "$work" "fuzz/corpus/$t" "${args[@]}" > "$art/$t.log" 2>&1 ||
         [ -n "$(ls -A "$art/$t")" ]; then
        tail -n 60 "$art/$t.log"
        failed+=("$t")
      fi
      grep -E "^stat::(number_of_executed_units|new_units_added)" "$art/$t.log" |
        sed "s/^/  $t /" || true
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz: findings in ${failed[*]} (inputs in $art/; add each to fuzz/regressions/)" >&2
      exit 1
    fi
    echo "fuzz: no findings"
    ;;
  *)
    echo "usage: $0 [release|asan|tsan|valgrind|fuzz]" >&2
    exit 2
    ;;
esac
