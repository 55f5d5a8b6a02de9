#!/usr/bin/env python3
"""replica_bench.py - what replica sync costs and how fast it is (BENCHMARKS.md, "Replicas").

Starts nats-server and N kvrouter replicas on loopback (release build in build/bin unless
KVR_BIN_DIR says otherwise), registers W workers on every replica (URL only: /v1/route needs no
live worker), then drives C client threads that each alternate between the replicas doing
  POST /v1/route {"token_ids": <T distinct tokens>}    (books the request: one "add" op
                                                       carrying T/16 sequence hashes)
  DELETE /v1/route/{id}                                (frees it: one "free" op)
for S seconds, RUNS times. It reports, per routed request, the sync messages and bytes every
replica published (kvrouter_replica_published_*), the ops per message (batching), and the delay
from a booking on one replica to its application on another (kvrouter_replica_sync_delay_seconds:
wall clocks of one machine; p50/p99 interpolated inside the histogram's buckets, which are 50-100
us wide up to 1.1 ms). The same load is run once against replicas without --nats, for the
request throughput with and without sync. Medians over the runs.

    scripts/build.sh release && bench/replica_bench.py [--runs 3] [--seconds 5] [--replicas 2]
"""
import argparse
import os
import re
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
os.environ.setdefault("KVR_BIN_DIR", os.path.join(HERE, "..", "build", "bin"))
import kvrh  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from test_replicas import NatsServer  # noqa: E402


def hist(r, family):
    """(bounds, cumulative counts) of a histogram family summed over labels."""
    b = {}
    for line in r.metrics().splitlines():
        m = re.match(r'%s_bucket\{.*le="([^"]+)"\}\s+(\S+)' % family, line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            b[le] = b.get(le, 0) + float(m.group(2))
    bounds = sorted(b)
    return bounds, [b[x] for x in bounds]


def quantile(bounds, cum, q):
    total = cum[-1] if cum else 0
    if total == 0:
        return float("nan")
    target = q * total
    prev_b, prev_c = 0.0, 0.0
    for bd, c in zip(bounds, cum):
        if c >= target:
            if bd == float("inf"):
                return prev_b
            frac = (target - prev_c) / (c - prev_c) if c > prev_c else 1.0
            return prev_b + frac * (bd - prev_b)
        prev_b, prev_c = bd, c
    return prev_b


def drive(routers, clients, seconds, ntok):
    stop = time.time() + seconds
    done = [0] * clients
    errors = [0] * clients

    def loop(k):
        i = k * 1_000_000
        while time.time() < stop:
            r = routers[(k + i) % len(routers)]
            i += 1
            toks = [(i * 7919 + j * 104729) % 30000 + 1 for j in range(ntok)]
            st, _, body = r.request("POST", "/v1/route", {"token_ids": toks})
            if st != 200:
                errors[k] += 1
                continue
            rid = int(re.search(rb'"request_id":(\d+)', body).group(1))
            st, _, _ = r.request("DELETE", "/v1/route/%d" % rid)
            if st != 200:
                errors[k] += 1
            done[k] += 1

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done), sum(errors), time.time() - t0


def start(n, workers, nats_url, flush=None):
    rs = []
    for i in range(n):
        args = ["--threads", "2", "--health-interval", "0", "--log-level", "warn"]
        if nats_url:
            args += ["--nats", nats_url, "--replica-id", str(i + 1)]
            if flush is not None:
                args += ["--replica-flush", flush]
        for w in range(workers):
            args += ["--worker", "id=%d,url=http://127.0.0.1:9" % (w + 1)]
        rs.append(kvrh.Router(*args))
    if nats_url:
        for r in rs:
            kvrh.wait_until(lambda r=r: r.json("GET", "/readyz")["replicas"]["peers"] == n - 1,
                            what="peers")
    return rs


def one_run(args, nats):
    rs = start(args.replicas, args.workers, nats.url, args.flush)
    try:
        n, err, el = drive(rs, args.clients, args.seconds, args.tokens)
        time.sleep(0.3)  # the last batches land
        msgs = sum(r.metric("kvrouter_replica_published_messages_total") for r in rs)
        byts = sum(r.metric("kvrouter_replica_published_bytes_total") for r in rs)
        ops = sum(r.metric("kvrouter_replica_published_ops_total") for r in rs)
        bounds, cum = None, None
        for r in rs:
            b, c = hist(r, "kvrouter_replica_sync_delay_seconds")
            if cum is None:
                bounds, cum = b, c
            else:
                cum = [x + y for x, y in zip(cum, c)]
        loads = [r.metric("kvrouter_load_active_requests") or 0 for r in rs]
        return {"requests": n, "errors": err, "rps": n / el, "msgs_per_req": msgs / n,
                "bytes_per_req": byts / n, "ops_per_msg": ops / msgs if msgs else 0,
                "delay_p50_us": quantile(bounds, cum, 0.5) * 1e6,
                "delay_p99_us": quantile(bounds, cum, 0.99) * 1e6,
                "samples": cum[-1] if cum else 0, "residual_load": sum(loads)}
    finally:
        for r in rs:
            r.stop()


def baseline(args):
    rs = start(args.replicas, args.workers, None)
    try:
        n, err, el = drive(rs, args.clients, args.seconds, args.tokens)
        return {"requests": n, "errors": err, "rps": n / el}
    finally:
        for r in rs:
            r.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024, help="prompt length (block size 16)")
    ap.add_argument("--flush", help="--replica-flush of the replicas (default: theirs, 1ms)")
    args = ap.parse_args()
    nats = NatsServer()
    try:
        runs = [one_run(args, nats) for _ in range(args.runs)]
        base = [baseline(args) for _ in range(args.runs)]
    finally:
        nats.stop()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    bmed = statistics.median(b["rps"] for b in base)
    print("replica sync: %d replicas, %d workers, %d clients, %d-token prompts, flush %s, %d runs of"
          " %.0f s (medians)" % (args.replicas, args.workers, args.clients, args.tokens,
                                 args.flush or "1ms", args.runs, args.seconds))
    print("  routed requests (route + free) per run  %.0f (%.0f req/s; without sync %.0f req/s)"
          % (med["requests"], med["rps"], bmed))
    print("  sync messages per routed request        %.3f (%.1f ops per message)"
          % (med["msgs_per_req"], med["ops_per_msg"]))
    print("  sync bytes per routed request           %.0f" % med["bytes_per_req"])
    print("  booking seen by another replica after   p50 %.0f us, p99 %.0f us (%.0f samples)"
          % (med["delay_p50_us"], med["delay_p99_us"], med["samples"]))
    print("  errors %d, load left booked after the run %d"
          % (sum(r["errors"] for r in runs), max(r["residual_load"] for r in runs)))
    import json
    print(json.dumps({"runs": runs, "baseline": base}))


if __name__ == "__main__":
    main()
