#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: set up, build, then the demo — kvrouter in front of
# four mock workers (prefix caches publishing vLLM-format KV events over ZMQ), fed by the bundled
# Mooncake conversation trace through the OpenAI-compatible proxy, once with the default policy
# and once with round_robin; prints the prefix hit ratio and each worker's share of requests.
# Extra arguments go to tools/demo.py (e.g. --requests 6000 --policy kv_cost --policy random).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
exec /usr/bin/python3 tools/demo.py --bin build/bin --requests 3000 "$@"
