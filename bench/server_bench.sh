#!/usr/bin/env bash
# HTTP server benchmark (BENCHMARKS.md, "HTTP server"): wrk against kvrouter on loopback.
#
#   bench/server_bench.sh [RUNS] [SECONDS]        (defaults: 3 runs of 10 s per workload)
#   bench/server_bench.sh --callgrind [SECONDS]   (user-space instructions per request)
#
# Workloads, each run RUNS times (medians reported), wrk -t2 -c64 unless noted:
#   query_by_hash   POST /query_by_hash, 32 local hashes (full-width u64), 16 ranks in the index
#   route           POST /v1/route, 32 block hashes, 16 candidates, no booking
#   route+free      POST /v1/route (booked) then DELETE /v1/route/{id}, alternating on each
#                   connection (-t2 -c2: wrk script state is per thread, so one connection each)
#   proxy           POST /v1/completions (64-token prompt, 1 output token) through kvrouter to
#                   a fast kvr-mock-worker (no prefill/decode delay), and the same workload sent
#                   to the worker directly in the same run (the proxy's added latency); at -c1
#                   (no queueing: the added latency itself), -c8 and -c64 (throughput)
# Besides req/s and p50/p99, each line gives kvrouter's CPU time per request (utime + stime
# from /proc, over the run) and wrk's own (bash `time` around it): figures that hold on a shared
# machine where req/s does not (wrk runs on the same cores; router + wrk CPU per request bounds
# the req/s two cores can give: 2 s / (router + wrk µs)).
# --callgrind runs the router (1 HTTP thread) under valgrind's callgrind, instrumentation
# switched on after the fill, and drives query_by_hash and route with wrk -t1 -c4 for SECONDS
# (default 6): instructions per request of the router's user space (libevent, libc and ours;
# not the kernel), a machine-independent figure for comparing changes.
# Needs: a release build (scripts/build.sh release; or KVR_BIN_DIR=DIR/bin), wrk, python3 (and valgrind for
# --callgrind). Processes are started here and stopped by their PIDs.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=wrk
if [ "${1:-}" = "--callgrind" ]; then MODE=callgrind; shift; fi
RUNS=${1:-3}
SECS=${2:-10}
[ $MODE = callgrind ] && SECS=${1:-6}
BIN=${KVR_BIN_DIR:-build/bin}  # another build: KVR_BIN_DIR=build-x/bin
WRK=bench/wrk
[ -x $BIN/kvrouter ] && [ -x $BIN/kvr-mock-worker ] || { echo "build first: scripts/build.sh release" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

start() { # name cmd... : starts in the background, waits for its "listening"/"ready" line
  local name=$1; shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pids+=($!)
  eval "${name}_pid=$!"
  for _ in $(seq 300); do grep -q "listening on\|ready" "$tmp/$name.out" 2>/dev/null && return 0; sleep 0.1; done
  echo "$name did not start" >&2; cat "$tmp/$name.err" >&2; exit 1
}

start worker $BIN/kvr-mock-worker --port 0 --prefill-us 0 --decode-us 0 --max-concurrent 0 \
  --block-size 16 --max-tokens 1
WPORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/worker.out" | head -1 | cut -d: -f3)
fill() { # PORT: 16 ranks holding the query's chain (bench/wrk/query_by_hash.lua) to different depths
  python3 - "$1" "$WPORT" $WRK/query_by_hash.lua <<'PY'
import http.client, json, re, sys
port, wport = int(sys.argv[1]), int(sys.argv[2])
hashes = [int(h) for h in re.findall(r'"(\d+)"', open(sys.argv[3]).read())]
assert len(hashes) == 32
c = http.client.HTTPConnection("127.0.0.1", port)
def post(path, body):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); r.read(); return r.status
evs = []
for w in range(16):
    depth = 2 + (w * 7) % 31
    evs.append({"worker_id": w, "event": {"event_id": 1, "data": {"stored": {"parent_hash": None,
        "blocks": [{"block_hash": w * 1000 + i, "tokens_hash": hashes[i]} for i in range(depth)]}}}})
assert post("/v1/events", evs) == 200
for w in range(16):
    assert post("/register", {"instance_id": w, "url": "http://127.0.0.1:%d" % wport}) == 201
PY
}

if [ $MODE = callgrind ]; then
  command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
  start router valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/cg.%p" \
    $BIN/kvrouter --listen 127.0.0.1:0 --threads 1 --health-interval 0 --log-level warn
  RPORT=$(grep -o ':[0-9]*$' "$tmp/router.out" | tr -d :)
  fill "$RPORT"
  R=http://127.0.0.1:$RPORT
  echo "# callgrind, 1 HTTP thread, wrk -t1 -c4 -d${SECS}s; user-space instructions per request"
  for w in query_by_hash:/query_by_hash route:/v1/route; do
    name=${w%%:*}; path=${w#*:}
    callgrind_control -i on "$router_pid" >/dev/null 2>&1
    callgrind_control -z "$router_pid" >/dev/null 2>&1
    n=$(wrk -t1 -c4 -d"${SECS}"s -s $WRK/$name.lua $R$path | grep -o '[0-9]* requests in' | cut -d' ' -f1)
    callgrind_control -d "$name" "$router_pid" >/dev/null 2>&1
    callgrind_control -i off "$router_pid" >/dev/null 2>&1
    f=$(grep -l "^desc: Trigger: .*$name" "$tmp"/cg.* | head -1)
    ir=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
    echo "$name: $n requests, $((ir / n)) instructions/request"
  done
  exit 0
fi

start router $BIN/kvrouter --listen 127.0.0.1:0 --threads 2 --health-interval 0 --log-level warn
RPORT=$(grep -o ':[0-9]*$' "$tmp/router.out" | tr -d :)
fill "$RPORT"

cpu() { awk '{print $14 + $15}' /proc/"$1"/stat; }
# run LABEL PID URL WRK_ARGS... -> one line: label rps p50 p99 cpu_us_per_req non2xx wrk_us_per_req
run() {
  local label=$1 pid=$2 url=$3; shift 3
  local t0 t1 TIMEFORMAT='%U %S'
  t0=$(cpu "$pid")
  { time wrk "$@" --latency -d"${SECS}"s "$url" >"$tmp/wrk.out" 2>&1; } 2>"$tmp/wrk.time"
  t1=$(cpu "$pid")
  python3 -c '
import re, sys
label, t0, t1, hz, out, tm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
t = open(out).read()
def lat(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)" % p, t, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v * {"us": 1, "ms": 1e3, "s": 1e6}[u]
n = int(re.search(r"(\d+) requests in", t).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
wu, ws = map(float, open(tm).read().split()[-2:])
print("%s %.0f %.0f %.0f %.2f %s %.2f" % (label, rps, lat(50), lat(99), (t1 - t0) * 1e6 / hz / n,
                                          errs.group(1) if errs else 0, (wu + ws) * 1e6 / n))
' "$label" "$t0" "$t1" "$(getconf CLK_TCK)" "$tmp/wrk.out" "$tmp/wrk.time"
}

R=http://127.0.0.1:$RPORT
W=http://127.0.0.1:$WPORT
results=$tmp/results.txt
for i in $(seq "$RUNS"); do
  run query_by_hash "$router_pid" $R/query_by_hash -t2 -c64 -s $WRK/query_by_hash.lua >>"$results"
  run route "$router_pid" $R/v1/route -t2 -c64 -s $WRK/route.lua >>"$results"
  run route+free "$router_pid" $R/v1/route -t2 -c2 -s $WRK/route_book.lua >>"$results"
  run proxy_c1 "$router_pid" $R/v1/completions -t1 -c1 -s $WRK/completions.lua >>"$results"
  run direct_c1 "$worker_pid" $W/v1/completions -t1 -c1 -s $WRK/completions.lua >>"$results"
  run proxy_c8 "$router_pid" $R/v1/completions -t1 -c8 -s $WRK/completions.lua >>"$results"
  run direct_c8 "$worker_pid" $W/v1/completions -t1 -c8 -s $WRK/completions.lua >>"$results"
  run proxy_c64 "$router_pid" $R/v1/completions -t2 -c64 -s $WRK/completions.lua >>"$results"
  run direct_c64 "$worker_pid" $W/v1/completions -t2 -c64 -s $WRK/completions.lua >>"$results"
done
echo "# $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg); $RUNS runs x ${SECS}s"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, *v = line.split()
    rows.setdefault(label, []).append([float(x) for x in v])
print("| workload | req/s | p50 µs | p99 µs | kvrouter CPU µs/req (direct: worker) | wrk CPU µs/req | non-2xx |")
print("|---|---:|---:|---:|---:|---:|---:|")
med = {}
for label, vals in rows.items():
    m = [statistics.median(col) for col in zip(*vals)]
    med[label] = m
    print("| %s | %.0f | %.0f | %.0f | %.1f | %.1f | %d |" % (label, m[0], m[1], m[2], m[3], m[5], m[4]))
for c in ("c1", "c8", "c64"):
    p, d = med.get("proxy_" + c), med.get("direct_" + c)
    if p and d:
        print("proxy added latency at %s: p50 %+.0f µs, p99 %+.0f µs" % (c, p[1] - d[1], p[2] - d[2]))
PY
