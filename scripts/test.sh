#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds, and runs every test.
#   scripts/test.sh            release build, all tests (the README's test command)
#   scripts/test.sh asan       the same suite under ASan+UBSan
#   scripts/test.sh tsan       the concurrency tests under TSan (label "concurrency")
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
scripts/setup.sh
scripts/build.sh "$flavour"
dir=build
[ "$flavour" = release ] || dir=build-$flavour
ctest_args=(--output-on-failure -j2)
[ "$flavour" = tsan ] && ctest_args+=(-L concurrency)
(cd "$dir" && ctest "${ctest_args[@]}")
