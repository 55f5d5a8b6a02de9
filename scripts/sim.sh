#!/usr/bin/env bash
# The policy lab on the bundled Mooncake conversation trace: every shipped policy, 8 workers,
# 4,096-block caches (docs/SIM.md), into build/sim-report/ (report.html, report.json, svg/), then the
# acceptance bar for the default policy (issue 7): >= 90% of the best achievable hit ratio,
# >= 1.5x round_robin's hit ratio, imbalance < 1.3.
#   scripts/sim.sh [build dir] [extra kvr-sim options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=$build/sim-report
mkdir -p "$out/svg"
policies=(round_robin random least_loaded power_of_two session_affinity kv_cost cache_aware
          weighted bounded_affinity)
args=()
for p in "${policies[@]}"; do args+=(--policy "$p"); done
"$build/bin/kvrouter" sim --trace data/traces/mooncake_fast25_conversation_trace.jsonl.gz \
  --workers 8 --cache-blocks 4096 --seed 1 "${args[@]}" \
  --json "$out/report.json" --html "$out/report.html" --svg-dir "$out/svg" "$@"
/usr/bin/python3 - "$out/report.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["policies"]
default, rr = p["bounded_affinity"], p["round_robin"]
share = default["hit_ratio"] / default["best_hit_ratio"]
gain = default["hit_ratio"] / rr["hit_ratio"]
print(f"default bounded_affinity: {100 * share:.1f}% of the best achievable hit ratio, "
      f"{gain:.2f}x round_robin, imbalance {default['imbalance']:.3f}")
ok = share >= 0.90 and gain >= 1.5 and default["imbalance"] < 1.3
print("acceptance bar (>= 90%, >= 1.5x, < 1.3):", "met" if ok else "NOT MET")
sys.exit(0 if ok else 1)
PY
