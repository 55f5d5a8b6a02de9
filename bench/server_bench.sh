#!/usr/bin/env bash
# HTTP server benchmark (BENCHMARKS.md, "HTTP server"): wrk against kvrouter on loopback.
#
#   bench/server_bench.sh [RUNS] [SECONDS]        (defaults: 3 runs of 10 s per workload)
#
# Workloads, each run RUNS times (medians reported), wrk -t2 -c64 unless noted:
#   query_by_hash   POST /query_by_hash, 32 local hashes, 16 ranks in the index
#   route           POST /v1/route, 32 block hashes, 16 candidates, no booking
#   route+free      POST /v1/route (booked) then DELETE /v1/route/{id}, alternating on each
#                   connection (-t2 -c2: wrk script state is per thread, so one connection each)
#   proxy           POST /v1/completions (64-token prompt, 1 output token) through kvrouter to
#                   a fast kvr-mock-worker (no prefill/decode delay), and the same workload sent
#                   to the worker directly in the same run (the proxy's added latency); at -c1
#                   (no queueing: the added latency itself), -c8 and -c64 (throughput)
# Besides req/s and p50/p99, each line gives kvrouter's CPU time per request (utime + stime
# from /proc, over the run): a figure that holds on a shared machine where req/s does not.
# Needs: a release build (scripts/build.sh release), wrk, python3. Processes are started here
# and stopped by their PIDs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
SECS=${2:-10}
BIN=build/bin
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
  for _ in $(seq 100); do grep -q "listening on\|ready" "$tmp/$name.out" 2>/dev/null && return 0; sleep 0.1; done
  echo "$name did not start" >&2; cat "$tmp/$name.err" >&2; exit 1
}

start worker $BIN/kvr-mock-worker --port 0 --prefill-us 0 --decode-us 0 --max-concurrent 0 \
  --block-size 16 --max-tokens 1
WPORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/worker.out" | head -1 | cut -d: -f3)
start router $BIN/kvrouter --listen 127.0.0.1:0 --threads 2 --health-interval 0 --log-level warn
RPORT=$(grep -o ':[0-9]*$' "$tmp/router.out" | tr -d :)
python3 - "$RPORT" "$WPORT" <<'PY'
import http.client, json, sys
port, wport = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
def post(path, body):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); r.read(); return r.status
evs = []
for w in range(16):  # 16 ranks holding the query's chain to different depths
    depth = 2 + (w * 7) % 31
    evs.append({"worker_id": w, "event": {"event_id": 1, "data": {"stored": {"parent_hash": None,
        "blocks": [{"block_hash": w * 1000 + i, "tokens_hash": 1001 + i} for i in range(depth)]}}}})
assert post("/v1/events", evs) == 200
for w in range(16):
    assert post("/register", {"instance_id": w, "url": "http://127.0.0.1:%d" % wport}) == 201
PY

cpu() { awk '{print $14 + $15}' /proc/"$1"/stat; }
# run LABEL PID URL WRK_ARGS... -> one line: label rps p50 p99 cpu_us_per_req
run() {
  local label=$1 pid=$2 url=$3; shift 3
  local t0 t1 out
  t0=$(cpu "$pid")
  out=$(wrk "$@" --latency -d"${SECS}"s "$url" 2>&1)
  t1=$(cpu "$pid")
  echo "$out" | python3 -c '
import re, sys
label, t0, t1, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = sys.stdin.read()
def lat(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)" % p, t, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v * {"us": 1, "ms": 1e3, "s": 1e6}[u]
n = int(re.search(r"(\d+) requests in", t).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print("%s %.0f %.0f %.0f %.2f %s" % (label, rps, lat(50), lat(99), (t1 - t0) * 1e6 / hz / n,
                                     errs.group(1) if errs else 0))
' "$label" "$t0" "$t1" "$(getconf CLK_TCK)"
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
print("| workload | req/s | p50 µs | p99 µs | kvrouter CPU µs/req (direct: worker) | non-2xx |")
print("|---|---:|---:|---:|---:|---:|")
med = {}
for label, vals in rows.items():
    m = [statistics.median(col) for col in zip(*vals)]
    med[label] = m
    print("| %s | %.0f | %.0f | %.0f | %.1f | %d |" % (label, m[0], m[1], m[2], m[3], m[4]))
for c in ("c1", "c8", "c64"):
    p, d = med.get("proxy_" + c), med.get("direct_" + c)
    if p and d:
        print("proxy added latency at %s: p50 %+.0f µs, p99 %+.0f µs" % (c, p[1] - d[1], p[2] - d[2]))
PY
