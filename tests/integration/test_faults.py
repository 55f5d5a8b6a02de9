"""Fault injection against the real router (issue 8): a worker SIGKILLed mid-stream (the client
gets a clean error, the booked load is freed, the worker is marked unhealthy, traffic moves);
every worker down (503 naming them, within a second); policies that loop forever, allocate
without bound, raise on every call or name a worker that does not exist (every request still
routed by the fallback, the counters show it, a concurrent /healthz stays under 100 ms); 100 hot
reloads under steady load (zero failed requests, exactly 100 installs); a flood of malformed
events interleaved with valid ones (every valid one applied: /dump equals that of a router fed
only the valid ones); oversized requests cut off while another client's stream goes on.

Latency bounds scale with KVR_TIME_SCALE (sanitizer and valgrind runs)."""
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 4


def stored(worker, parent, hashes, rank=0, eid=1):
    return {"worker_id": worker, "event": {"event_id": eid, "dp_rank": rank, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": h, "tokens_hash": h ^ 0x5bd1e995}
                                          for h in hashes]}}}}


def removed(worker, hashes, rank=0, eid=1):
    return {"worker_id": worker, "event": {"event_id": eid, "dp_rank": rank, "data": {
        "removed": {"block_hashes": hashes}}}}


class Poller:
    """GET /healthz in a loop on its own connection; records the slowest answer."""

    def __init__(self, r):
        self.r, self.max, self.n, self.bad = r, 0.0, 0, []
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        c = self.r.conn(10)
        while not self.stop_ev.is_set():
            t = time.monotonic()
            try:
                c.request("GET", "/healthz")
                resp = c.getresponse()
                resp.read()
                st = resp.status
            except (OSError, http.client.HTTPException) as e:
                st = repr(e)
                c.close()
                c = self.r.conn(10)
            self.max = max(self.max, time.monotonic() - t)
            self.n += 1
            if st != 200:
                self.bad.append(st)
            time.sleep(0.005)
        c.close()

    def stop(self):
        self.stop_ev.set()
        self.th.join(10)
        return self.max


class WorkerFaults(unittest.TestCase):
    def test_worker_killed_mid_stream(self):
        a = kvrh.MockWorker("--decode-us", "40000", block_size=BS, zmq=False)
        b = kvrh.MockWorker("--decode-us", "1000", block_size=BS, zmq=False)
        r = kvrh.Router("--block-size", BS, "--health-interval", "200ms", "--health-fails", "1",
                        "--health-timeout", "300ms")
        try:
            # only worker 1 at first, so the stream goes there; worker 2 joins during it
            r.json("POST", "/v1/workers", {"id": 1, "url": a.url}, expect=201)
            prompt = list(range(32))
            c = r.conn(30)
            c.request("POST", "/v1/completions", json.dumps({
                "prompt": prompt, "max_tokens": 100, "stream": True}),
                {"Content-Type": "application/json"})
            resp = c.getresponse()
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.getheader("x-kvrouter-worker"), "1:0")
            first = resp.readline()  # the first SSE bytes arrived: mid-stream now
            self.assertTrue(first)
            kvrh.wait_until(lambda: r.metric("kvrouter_load_active_requests") == 1,
                            what="the stream booked")
            r.json("POST", "/v1/workers", {"id": 2, "url": b.url}, expect=201)
            a.stop(signal.SIGKILL)
            t0 = time.monotonic()
            with self.assertRaises((http.client.IncompleteRead, http.client.HTTPException,
                                    OSError)):
                resp.read()  # a cut stream: never a clean end that looks complete
            self.assertLess(time.monotonic() - t0, kvrh.scaled(2.0))
            c.close()
            kvrh.wait_until(lambda: r.metric("kvrouter_load_active_requests") == 0,
                            what="the booked load freed")
            self.assertGreaterEqual(r.metric("kvrouter_proxy_upstream_errors_total",
                                             kind="midstream"), 1)
            kvrh.wait_until(lambda: r.metric("kvrouter_worker_healthy", worker_id="1") == 0,
                            what="worker 1 marked unhealthy")
            # traffic moves: every request now goes to worker 2 and succeeds
            for _ in range(10):
                st, hdrs, data = r.request("POST", "/v1/completions",
                                           {"prompt": prompt, "max_tokens": 2})
                self.assertEqual((st, hdrs.get("x-kvrouter-worker")), (200, "2:0"), data)
            self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())
            a.stop()
            b.stop()

    def test_all_workers_down_is_a_quick_503(self):
        ws = [kvrh.MockWorker(block_size=BS, zmq=False) for _ in range(2)]
        r = kvrh.Router("--block-size", BS, "--health-interval", "0")
        try:
            for k, w in enumerate(ws):
                r.json("POST", "/v1/workers", {"id": k + 1, "url": w.url}, expect=201)
            self.assertEqual(r.request("POST", "/v1/completions",
                                       {"prompt": list(range(8)), "max_tokens": 1})[0], 200)
            for w in ws:
                w.stop(signal.SIGKILL)
            first = True
            for path, body in (("/v1/completions", {"prompt": list(range(8)), "max_tokens": 1}),
                               ("/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "hi"}]})):
                for _ in range(4):
                    t0 = time.monotonic()
                    st, _, data = r.request("POST", path, body)
                    took = time.monotonic() - t0
                    self.assertEqual(st, 503, data)
                    msg = json.loads(data)["error"]
                    self.assertLess(took, kvrh.scaled(1.0), msg)
                    if first:  # every candidate tried: the answer names them all
                        self.assertIn("can be reached", msg)
                        self.assertIn("worker 1", msg)
                        self.assertIn("worker 2", msg)
                        first = False
                    else:  # then their circuit breakers open: no candidate left at all
                        self.assertTrue("can be reached" in msg or "no eligible worker" in msg,
                                        msg)
            self.assertGreaterEqual(r.metric("kvrouter_worker_breaker_opens_total"), 1)
            self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)
            self.assertEqual(r.get("/healthz")[0], 200)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())


LOOP = """return { select = function(req, c)
  if req.headers["x-fault"] then while true do end end
  return c[1]
end }"""
ALLOC = """return { select = function(req, c)
  if req.headers["x-fault"] then
    local t = {}
    for i = 1, 1e9 do t[i] = string.rep("x", 1048576) .. i end
  end
  return c[1]
end }"""
ERROR = """return { select = function(req, c)
  if req.headers["x-fault"] then error("this policy fails on every call") end
  return c[1]
end }"""
NOWORKER = """return { select = function(req, c)
  if req.headers["x-fault"] then return { id = 999999, dp_rank = 0 } end
  return c[1]
end }"""


class PolicyFaults(unittest.TestCase):
    def setUp(self):
        self.w = kvrh.MockWorker(block_size=BS, zmq=False)
        # one HTTP thread: the poller's /healthz shares it with the faulty decisions. The router
        # starts on the built-in policy (no shipped policy to validate at start), and the budget
        # follows KVR_TIME_SCALE (10 ms normally)
        self.r = kvrh.Router("--block-size", BS, "--health-interval", "0", "--threads", "1",
                             "--policy", "builtin",
                             "--policy-budget", "%dms" % round(kvrh.scaled(10)))
        if self.r.json("GET", "/admin/status")["policy"].get("runtime") != "lua":
            self.fail("this build has no Lua policy runtime")
        for wid in (1, 2):
            self.r.json("POST", "/v1/workers", {"id": wid, "url": self.w.url}, expect=201)

    def tearDown(self):
        self.assertEqual(self.r.stop(), 0, self.r.stderr())
        self.w.stop()

    def test_bad_policies_fall_back_and_stay_responsive(self):
        r = self.r
        cases = [("loop", LOOP, "kvrouter_policy_lua_timeouts_total"),
                 ("alloc", ALLOC, None),  # the memory cap or the time budget, whichever first
                 ("error", ERROR, "kvrouter_policy_lua_errors_total"),
                 ("noworker", NOWORKER, "kvrouter_policy_invalid_total")]
        n = 8
        for name, src, family in cases:
            with self.subTest(policy=name):
                r.json("POST", "/admin/policy", src)
                before = {f: r.metric(f) or 0 for f in (
                    "kvrouter_policy_fallback_decisions_total", "kvrouter_policy_lua_timeouts_total",
                    "kvrouter_policy_lua_oom_total", "kvrouter_policy_lua_errors_total",
                    "kvrouter_policy_invalid_total")}
                poll = Poller(r)
                k = 0
                try:
                    # at least n faulty decisions, and as many as the poller needs to probe
                    # the router many times while they run
                    while k < n or poll.n < 20:
                        res = r.json("POST", "/v1/route", {"token_ids": list(range(16 + k % 64))},
                                     headers={"x-fault": "1"})
                        self.assertIn(res["worker_id"], (1, 2))
                        self.assertTrue(res["fallback"], res)
                        r.json("DELETE", "/v1/route/%d" % res["request_id"])
                        k += 1
                    # proxied requests too
                    st, hdrs, data = r.request("POST", "/v1/completions",
                                               {"prompt": list(range(8)), "max_tokens": 2},
                                               headers={"x-fault": "1"})
                    self.assertEqual(st, 200, data)
                finally:
                    worst = poll.stop()
                print("policy %s: %d faulty decisions, %d /healthz polls, slowest %.1f ms"
                      % (name, k, poll.n, worst * 1000), file=sys.stderr)
                self.assertEqual(poll.bad, [])
                self.assertLess(worst, kvrh.scaled(0.1), "max /healthz latency %.1f ms"
                                % (worst * 1000))
                after = lambda f: (r.metric(f) or 0) - before[f]  # noqa: E731
                self.assertEqual(after("kvrouter_policy_fallback_decisions_total"), k + 1)
                if family is not None:
                    self.assertEqual(after(family), k + 1, family)
                else:
                    self.assertEqual(after("kvrouter_policy_lua_oom_total") +
                                     after("kvrouter_policy_lua_timeouts_total"), k + 1)
                # without the fault header the policy decides again
                self.assertFalse(r.json("POST", "/v1/route",
                                        {"token_ids": list(range(16)), "book": False})["fallback"])
        self.assertEqual(r.get("/healthz")[0], 200)

    def test_hundred_hot_reloads_under_load(self):
        r = self.r
        pick_first = """return { select = function(req, c)
  local best = c[1]
  for i = 2, #c do if c[i].id < best.id then best = c[i] end end
  return best
end }"""
        pick_last = pick_first.replace("<", ">")
        done = threading.Event()
        results = {"ok": 0, "bad": []}
        lock = threading.Lock()

        def load():
            c = r.conn(30)
            k = 0
            while not done.is_set():
                k += 1
                path, body = (("/v1/completions", {"prompt": list(range(8 + k % 8)),
                                                   "max_tokens": 2})
                              if k % 2 else ("/v1/route", {"token_ids": list(range(16)),
                                                           "book": False}))
                try:
                    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                    resp = c.getresponse()
                    data = resp.read()
                    st = resp.status
                except (OSError, http.client.HTTPException) as e:
                    st, data = repr(e), b""
                    c.close()
                    c = r.conn(30)
                with lock:
                    if st == 200:
                        results["ok"] += 1
                    else:
                        results["bad"].append((path, st, data[:200]))
            c.close()

        reloads0 = r.metric("kvrouter_policy_reloads_total") or 0
        ths = [threading.Thread(target=load) for _ in range(3)]
        for t in ths:
            t.start()
        gens = []
        try:
            for k in range(100):
                # each install lands while requests are flowing: wait for one more answer
                seen = results["ok"]
                kvrh.wait_until(lambda: results["ok"] > seen or results["bad"],
                                what="a request between two installs")
                gens.append(r.json("POST", "/admin/policy", pick_first if k % 2 else pick_last)
                            ["generation"])
        finally:
            done.set()
            for t in ths:
                t.join(30)
        self.assertEqual(results["bad"], [])
        self.assertGreaterEqual(results["ok"], 100)
        self.assertEqual(len(set(gens)), 100)
        self.assertEqual(gens, sorted(gens))
        self.assertEqual((r.metric("kvrouter_policy_reloads_total") or 0) - reloads0, 100)


class EventFaults(unittest.TestCase):
    def test_malformed_events_interleaved_with_valid_ones(self):
        rng = random.Random(int(os.environ.get("KVR_TEST_SEED", "8")))
        valid, bodies = [], []
        base = 1 << 32
        chains = {}  # worker -> last hash of its chain
        junk = [
            {"worker_id": "seven", "event": {}},
            {"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"blocks": "x"}}}},
            {"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {
                "parent_hash": None, "blocks": [{"block_hash": -1.5, "tokens_hash": 1}]}}}},
            {"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [
                18446744073709551616]}}}},
            {"worker_id": 1, "event": {"event_id": 1, "data": {"exploded": {}}}},
            [], 42, None, "stored",
            {"event": {"data": {"stored": {"parent_hash": None, "blocks": []}}}},
        ]
        for k in range(300):
            w = 1 + rng.randrange(4)
            if w in chains and rng.random() < 0.15:
                ev = removed(w, [chains.pop(w)], eid=k)
            else:
                h = base + k
                ev = stored(w, chains.get(w), [h], eid=k)
                chains[w] = h
            valid.append(ev)
        # the flood: bodies mixing valid and malformed elements, and bodies that are not JSON
        flood, i = [], 0
        while i < len(valid):
            n = rng.randrange(1, 6)
            body = []
            for ev in valid[i:i + n]:
                body += [rng.choice(junk) for _ in range(rng.randrange(3))]
                body.append(ev)
            i += n
            flood.append(json.dumps(body).encode())
            if rng.random() < 0.3:
                flood.append(rng.choice([b"[{", b"not json", b"\xff\xfe", b"[1,]", b"{}{}"]))
        a = kvrh.Router("--block-size", BS)
        b = kvrh.Router("--block-size", BS)
        try:
            applied = rejected = refused = 0
            for body in flood:
                st, _, data = a.post("/v1/events", body)
                if st == 200:
                    res = json.loads(data)
                    applied += res["applied"]
                    rejected += len(res["rejected"])
                else:
                    self.assertEqual(st, 400, data)
                    refused += 1
            for k in range(0, len(valid), 50):
                res = b.json("POST", "/v1/events", valid[k:k + 50])
                self.assertEqual(res["rejected"], [])
            self.assertEqual(applied, len(valid))
            self.assertGreater(rejected, 50)
            self.assertGreater(refused, 5)
            self.assertEqual(a.json("GET", "/dump"), b.json("GET", "/dump"))
            self.assertGreater(len(a.json("GET", "/dump")["default:default"]["events"]), 10)
            self.assertEqual(a.metric("kvrouter_http_requests_total", route="/v1/events",
                                      code="400"), refused)
        finally:
            self.assertEqual(a.stop(), 0, a.stderr())
            self.assertEqual(b.stop(), 0, b.stderr())


class LimitFaults(unittest.TestCase):
    def test_oversized_requests_do_not_disturb_a_stream(self):
        w = kvrh.MockWorker("--decode-us", "20000", block_size=BS, zmq=False)
        r = kvrh.Router("--block-size", BS, "--health-interval", "0", "--threads", "1",
                        "--max-body", "64K", "--max-headers", "8K")
        try:
            r.json("POST", "/v1/workers", {"id": 1, "url": w.url}, expect=201)
            res = {}

            def stream():
                res["r"] = r.request("POST", "/v1/completions", {
                    "prompt": list(range(16)), "max_tokens": 60, "stream": True})
            th = threading.Thread(target=stream)
            th.start()
            kvrh.wait_until(lambda: r.metric("kvrouter_load_active_requests") == 1,
                            what="the stream started")
            big = b"[" + b" " * (1 << 20) + b"]"
            cut = 0
            for path in ("/v1/events", "/v1/completions", "/query"):
                try:
                    st, _, _ = r.post(path, big)
                    self.assertEqual(st, 413)
                except (ConnectionError, http.client.HTTPException):
                    pass  # closed while we were still sending: cut off as well
                cut += 1
            raw = kvrh.raw_http(r.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " +
                                b"y" * 16384 + b"\r\n\r\n")
            self.assertFalse(raw.startswith(b"HTTP/1.1 200"), raw[:100])
            self.assertTrue(th.is_alive(), "the stream should still be running")
            th.join(kvrh.scaled(30))
            st, hdrs, data = res["r"]
            self.assertEqual(st, 200)
            text = data.decode()
            self.assertTrue(text.rstrip().endswith("data: [DONE]"), text[-200:])
            self.assertGreaterEqual(text.count("data: ") - 1, 60)  # every token, then [DONE]
            self.assertEqual(cut, 3)
            self.assertEqual(r.get("/healthz")[0], 200)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())
            w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
