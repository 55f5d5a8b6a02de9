"""Concurrency stress against the real binary (4 HTTP threads): KV events over HTTP and ZMQ,
index queries, routing with booking and release, proxied requests, worker registration churn,
metrics and admin reads, all at once from many client threads. Every answer must be one the
API allows, the load must drain to zero, and the router must exit 0 (under ThreadSanitizer a
data race makes it exit non-zero)."""
import json
import os
import random
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 4
DURATION = float(os.environ.get("KVR_STRESS_SECONDS", "4"))


class Stress(unittest.TestCase):
    def test_everything_at_once(self):
        mock = kvrh.MockWorker(block_size=BS, zmq=True)
        fake = kvrh.FakeWorker()
        r = kvrh.Router("--threads", "4", "--block-size", str(BS), "--health-interval", "200ms",
                        "--retry-backoff", "1ms")
        errors = []
        counts = {}
        lock = threading.Lock()
        stop = time.time() + DURATION

        def note(kind, st, allowed):
            with lock:
                counts[kind] = counts.get(kind, 0) + 1
                if st not in allowed:
                    errors.append((kind, st))

        try:
            r.json("POST", "/register", {"instance_id": 1, "url": mock.url, "endpoint": mock.zmq},
                   expect=201)
            r.json("POST", "/register", {"instance_id": 2, "url": fake.url}, expect=201)

            def events(seed):
                rng = random.Random(seed)
                while time.time() < stop:
                    w = 100 + rng.randrange(4)
                    base = rng.randrange(1 << 40)
                    evs = [{"worker_id": w, "event": {"event_id": 1, "data": {"stored": {
                        "parent_hash": None, "blocks": [{"block_hash": base + i,
                                                         "tokens_hash": rng.randrange(8)}
                                                        for i in range(rng.randrange(1, 20))]}}}},
                           {"worker_id": w, "event": {"event_id": 2, "data": {"removed": {
                               "block_hashes": [base, base + 1]}}}}]
                    if rng.random() < 0.05:
                        evs.append({"worker_id": w, "event": {"event_id": 3, "data": "cleared"}})
                    st, _, _ = r.post("/v1/events", evs)
                    note("events", st, (200,))

            def queries(seed):
                rng = random.Random(seed)
                while time.time() < stop:
                    q = [rng.randrange(8) for _ in range(32)]
                    st, _, _ = r.post("/query_by_hash", {"block_hashes": q})
                    note("query", st, (200,))

            def routes(seed):
                rng = random.Random(seed)
                while time.time() < stop:
                    st, _, data = r.post("/v1/route", {"token_ids": [rng.randrange(50)
                                                                     for _ in range(64)]})
                    note("route", st, (200, 503))
                    if st == 200:
                        rid = json.loads(data)["request_id"]
                        # 404 when the churn removed the chosen worker (and its booked load)
                        note("first", r.post("/v1/route/%d/first_token" % rid)[0], (200, 404))
                        note("free", r.request("DELETE", "/v1/route/%d" % rid)[0], (200, 404))

            def proxied(seed):
                rng = random.Random(seed)
                while time.time() < stop:
                    body = {"prompt": [rng.randrange(30) for _ in range(40)], "max_tokens": 2,
                            "stream": rng.random() < 0.5}
                    st, _, _ = r.post("/v1/completions", body)
                    note("proxy", st, (200, 503))

            def churn(seed):
                rng = random.Random(seed)
                while time.time() < stop:
                    wid = 300 + rng.randrange(6)
                    st, _, _ = r.post("/register", {"instance_id": wid, "url": fake.url,
                                                    "dp_rank": rng.randrange(2)})
                    note("register", st, (201, 409))
                    st, _, _ = r.post("/unregister", {"instance_id": wid})
                    note("unregister", st, (200, 404))

            def reads(seed):
                while time.time() < stop:
                    for p in ("/metrics", "/admin/status", "/dump", "/v1/workers", "/workers",
                              "/v1/models", "/readyz"):
                        note("read", r.get(p)[0], (200,))

            fns = [events, events, queries, queries, routes, routes, proxied, proxied, churn,
                   reads]
            ths = [threading.Thread(target=f, args=(i,)) for i, f in enumerate(fns)]
            for t in ths:
                t.start()
            for t in ths:
                t.join(DURATION + 60)
            self.assertEqual(errors, [])
            for kind in ("events", "query", "route", "proxy", "register", "read"):
                self.assertGreater(counts.get(kind, 0), 0, kind)
            kvrh.wait_until(lambda: r.metric("kvrouter_load_active_requests", worker_id="1") in
                            (0, None) and r.metric("kvrouter_load_active_requests",
                                                   worker_id="2") in (0, None),
                            what="all load released")
            print("requests:", counts, file=sys.stderr)
        finally:
            code = r.stop()
            mock.stop()
            fake.stop()
        err = r.stderr()
        at = err.find("WARNING: ThreadSanitizer")
        self.assertEqual(code, 0, err[at:at + 20000] if at >= 0 else err[-5000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
