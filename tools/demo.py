#!/usr/bin/python3
"""kvrouter demo: a router in front of mock workers, fed by a Mooncake trace.

Starts N kvr-mock-worker processes (prefix cache of C blocks each, vLLM-format KV events on ZMQ),
one kvrouter that subscribes to their events, and replays the first R requests of a Mooncake trace
through the router's OpenAI-compatible /v1/completions endpoint, once per policy. Between policies
the workers are restarted (empty caches) and the router too. Prints, per policy, the prefix hit
ratio the workers report (cached prompt tokens / prompt tokens), the best achievable hit ratio
for the trace, and each worker's share of requests.

Request mapping: each trace hash id becomes one block of B copies of the token id (B = the block
size), so a prompt is len(hash_ids) blocks; output is capped at --max-tokens.

Standard library only (Debian's python3). Usage: tools/demo.py [--bin build/bin] [--workers 4] ...
"""
import argparse
import gzip
import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time


def read_trace(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
                if len(out) >= limit:
                    break
    return out


def best_hit_ratio(reqs):
    """Each request's longest prefix of hash ids seen in any earlier request (infinite cache)."""
    seen = set()
    hit = total = 0
    for r in reqs:
        ids = r["hash_ids"]
        prefix = ()
        n = 0
        for h in ids:
            prefix = prefix + (h,)
            if prefix in seen:
                n += 1
            else:
                break
        hit += n
        total += len(ids)
        prefix = ()
        for h in ids:
            prefix = prefix + (h,)
            seen.add(prefix)
    return hit / total if total else 0.0


class Proc:
    """A child process whose stdout lines are collected; waits for a readiness line."""

    def __init__(self, argv, ready, name):
        self.name = name
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.q = queue.Queue()
        t = threading.Thread(target=self._pump, daemon=True)
        t.start()
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                line = self.q.get(timeout=0.5)
            except queue.Empty:
                if self.p.poll() is not None:
                    break
                continue
            if ready in line:
                return
        self.stop()
        raise RuntimeError("%s did not start:\n%s" % (name, "".join(self.lines[-20:])))

    def _pump(self):
        for line in self.p.stdout:
            self.lines.append(line)
            self.q.put(line)

    def find(self, pattern):
        for line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m.group(1)
        raise RuntimeError("%s: no line matches %r:\n%s" % (self.name, pattern, "".join(self.lines)))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def post(port, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"content-type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body), headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, dict((k.lower(), v) for k, v in r.getheaders())


def start_workers(args):
    workers = []
    for i in range(args.workers):
        argv = [os.path.join(args.bin, "kvr-mock-worker"), "--port", "0",
                "--block-size", str(args.block_size), "--cache-blocks", str(args.cache_blocks),
                "--zmq", "tcp://127.0.0.1:*", "--replay", "tcp://127.0.0.1:*",
                "--prefill-us", str(args.prefill_us), "--decode-us", str(args.decode_us),
                "--max-concurrent", str(args.worker_slots), "--seed", str(i + 1)]
        w = Proc(argv, "ready", "worker %d" % (i + 1))
        w.http = int(w.find(r"http://127\.0\.0\.1:(\d+)"))
        w.zmq = w.find(r"(tcp://127\.0\.0\.1:\d+)")
        w.replay = w.find(r"replay\S*\s+(tcp://127\.0\.0\.1:\d+)")
        workers.append(w)
    return workers


def start_router(args, policy):
    argv = [os.path.join(args.bin, "kvrouter"), "--listen", "127.0.0.1:0", "--threads", "2",
            "--block-size", str(args.block_size), "--health-interval", "0"]
    if policy:
        argv += ["--policy", policy]
    r = Proc(argv, "listening", "kvrouter")
    r.port = int(r.find(r"listening on \S*:(\d+)"))
    return r


def run_policy(args, reqs, policy):
    workers = start_workers(args)
    router = None
    try:
        router = start_router(args, policy)
        for i, w in enumerate(workers):
            st, body, _ = post(router.port, "/register", {
                "instance_id": i + 1, "url": "http://127.0.0.1:%d" % w.http, "endpoint": w.zmq,
                "replay_endpoint": w.replay, "model_name": "default", "block_size": args.block_size})
            if st not in (200, 201):
                raise RuntimeError("register worker %d: %d %s" % (i + 1, st, body))
        time.sleep(1.0)  # ZMQ slow-joiner window: let the subscriptions settle
        totals = {"prompt": 0, "cached": 0, "errors": 0}
        per_worker = {}
        lock = threading.Lock()
        work = queue.Queue()
        for r in reqs:
            work.put(r)

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
            while True:
                try:
                    r = work.get_nowait()
                except queue.Empty:
                    break
                tokens = []
                for h in r["hash_ids"]:
                    tokens.extend([h & 0x7FFFFFFF] * args.block_size)
                body = json.dumps({"model": "default", "prompt": tokens,
                                   "max_tokens": args.max_tokens, "stream": False})
                try:
                    conn.request("POST", "/v1/completions", body=body,
                                 headers={"content-type": "application/json"})
                    resp = conn.getresponse()
                    data = resp.read()
                    worker = resp.getheader("x-kvrouter-worker", "?")
                    if resp.status != 200:
                        raise RuntimeError("status %d" % resp.status)
                    usage = json.loads(data)["usage"]
                    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                    with lock:
                        totals["prompt"] += usage["prompt_tokens"]
                        totals["cached"] += cached
                        per_worker[worker] = per_worker.get(worker, 0) + 1
                except Exception:
                    with lock:
                        totals["errors"] += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=120)
            conn.close()

        t0 = time.time()
        threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        secs = time.time() - t0
        return {"policy": policy or "(router default)", "requests": len(reqs), "seconds": secs,
                "hit_ratio": totals["cached"] / totals["prompt"] if totals["prompt"] else 0.0,
                "errors": totals["errors"], "per_worker": per_worker}
    finally:
        if router:
            router.stop()
        for w in workers:
            w.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--trace", default="data/traces/mooncake_fast25_conversation_trace.jsonl.gz")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--cache-blocks", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32, help="client connections")
    ap.add_argument("--prefill-us", type=int, default=4,
                    help="mock prefill time per uncached prompt token (us)")
    ap.add_argument("--decode-us", type=int, default=2000, help="mock time per output token (us)")
    ap.add_argument("--worker-slots", type=int, default=8, help="requests a mock worker runs at once")
    ap.add_argument("--policy", action="append", default=None,
                    help="policies to compare (default: the router's default, then round_robin)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    reqs = read_trace(args.trace, args.requests)
    best = best_hit_ratio(reqs)
    policies = args.policy or ["", "round_robin"]
    print("kvrouter demo: %d requests of %s, %d mock workers (%d-block caches), block size %d"
          % (len(reqs), os.path.basename(args.trace), args.workers, args.cache_blocks, args.block_size))
    results = []
    for p in policies:
        res = run_policy(args, reqs, p)
        results.append(res)
        print("  %-22s hit ratio %5.1f%%  (%.1f%% of the best achievable)  %d errors  %.1f s"
              % (res["policy"], 100 * res["hit_ratio"], 100 * res["hit_ratio"] / best if best else 0,
                 res["errors"], res["seconds"]))
    print("best achievable hit ratio for these requests: %.1f%%" % (100 * best))
    print("requests per worker:")
    names = sorted({w for r in results for w in r["per_worker"]})
    print("  %-22s %s" % ("policy", "  ".join("%8s" % n for n in names)))
    for r in results:
        n = max(1, sum(r["per_worker"].values()))
        print("  %-22s %s" % (r["policy"], "  ".join("%7.1f%%" % (100 * r["per_worker"].get(w, 0) / n) for w in names)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"best_hit_ratio": best, "results": results}, f, indent=2)
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
