"""Lua policies in the router (needs the Lua runtime; skipped when the build has none):
POST /admin/policy hot reload under load with zero failed requests, refused installs with line
numbers, failing policies falling back to the built-in one, --policy FILE and SIGHUP reload,
per-request policy choice by header when allowed."""
import json
import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

# the candidate with the lowest / highest worker id (candidate order is not guaranteed)
PICK_FIRST = """return { select = function(req, c)
  local best = c[1]
  for i = 2, #c do if c[i].id < best.id then best = c[i] end end
  return best
end }
"""
PICK_LAST = PICK_FIRST.replace("<", ">")
# fails only for requests carrying x-boom (the install-time checks do not send it)
FLAKY = """return { select = function(req, c)
  if req.headers["x-boom"] then error("boom on purpose") end
  local best = c[1]
  for i = 2, #c do if c[i].id < best.id then best = c[i] end end
  return best
end }
"""


def lua_runtime(r):
    return r.json("GET", "/admin/status")["policy"]["runtime"] == "lua"


class PolicyReload(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = kvrh.Router()
        try:
            cls.have_lua = lua_runtime(r)
        finally:
            r.stop()

    def setUp(self):
        if not self.have_lua:
            self.skipTest("this build has no Lua policy runtime")

    def router(self, *extra):
        r = kvrh.Router("--block-size", "4", "--health-interval", "0", *extra)
        self.addCleanup(lambda: self.assertEqual(r.stop(), 0, r.stderr()))
        for wid in (1, 2, 3):
            r.json("POST", "/register", {"instance_id": wid, "url": "http://127.0.0.1:9"},
                   expect=201)
        return r

    def pick(self, r, **kw):
        return r.json("POST", "/v1/route", {"token_ids": list(range(16)), "book": False}, **kw)

    def test_hot_reload_under_load_loses_no_request(self):
        fake = kvrh.FakeWorker()
        self.addCleanup(fake.stop)
        r = self.router("--threads", "4")
        for wid in (1, 2, 3):
            r.json("POST", "/unregister", {"instance_id": wid})
            r.json("POST", "/register", {"instance_id": wid, "url": fake.url}, expect=201)
        stop = time.time() + 4
        bad, done = [], [0]
        lock = threading.Lock()

        def load(kind):
            while time.time() < stop:
                if kind == "route":
                    st, _, data = r.post("/v1/route", {"token_ids": list(range(16)), "book": False})
                else:
                    st, _, data = r.post("/v1/completions", {"prompt": list(range(16))})
                with lock:
                    done[0] += 1
                    if st != 200:
                        bad.append((kind, st, data[:200]))
        ths = [threading.Thread(target=load, args=(k,)) for k in ("route", "route", "proxy",
                                                                   "proxy")]
        for t in ths:
            t.start()
        gens = []
        while time.time() < stop - 0.5:
            for src in (PICK_FIRST, PICK_LAST):
                g = r.json("POST", "/admin/policy", src)["generation"]
                gens.append(g)
                # live on every thread when the install answers
                want = 1 if src == PICK_FIRST else 3
                self.assertEqual(self.pick(r)["worker_id"], want)
        for t in ths:
            t.join(30)
        self.assertEqual(bad, [])
        self.assertGreater(done[0], 50)
        self.assertEqual(gens, sorted(gens))
        self.assertGreater(len(gens), 4)
        st = r.json("GET", "/admin/status")["policy"]
        self.assertEqual(set(st["thread_generations"]), {st["generation"]})

    def test_refused_installs_change_nothing(self):
        r = self.router()
        r.json("POST", "/admin/policy", PICK_LAST)
        e = r.json("POST", "/admin/policy", "return { select = function(req, c)\n  return c[1]\n",
                   expect=400)
        self.assertIn("default.lua:3:", e["error"])
        e = r.json("POST", "/admin/policy", "return { select = function(req, c) while true do end "
                   "end }", expect=400)
        self.assertIn("etimedout", e["error"])
        e = r.json("POST", "/admin/policy", "return 42", expect=400)
        self.assertIn("select", e["error"])
        self.assertEqual(self.pick(r)["worker_id"], 3)  # still the last good one
        r.json("POST", "/admin/policy?model=nope", PICK_FIRST, expect=404)
        r.json("POST", "/admin/policy?model=default", PICK_FIRST)
        self.assertEqual(self.pick(r)["worker_id"], 1)

    def test_failing_policy_falls_back_and_is_counted(self):
        r = self.router()
        r.json("POST", "/admin/policy", FLAKY)
        self.assertEqual(self.pick(r)["worker_id"], 1)
        for _ in range(5):
            d = r.json("POST", "/v1/route", {"token_ids": list(range(16)), "book": False,
                                             "headers": {"x-boom": "1"}})
            self.assertTrue(d["fallback"])
        self.assertEqual(r.metric("kvrouter_policy_lua_errors_total", policy="default"), 5)
        self.assertEqual(r.metric("kvrouter_policy_fallbacks_total"), 5)
        self.assertIn("boom on purpose", r.stderr())

    def test_policy_file_and_sighup(self):
        d = kvrh.tmpdir()
        path = os.path.join(d, "mine.lua")
        with open(path, "w") as f:
            f.write(PICK_LAST)
        r = self.router("--policy", path)
        self.assertEqual(self.pick(r)["worker_id"], 3)
        self.assertEqual(self.pick(r)["policy"], "mine")
        with open(path, "w") as f:
            f.write(PICK_FIRST)
        r.send(signal.SIGHUP)
        kvrh.wait_until(lambda: self.pick(r)["worker_id"] == 1, what="SIGHUP reload")
        with open(path, "w") as f:
            f.write("return {")  # a broken file: refused, the old policy stays
        g = r.json("GET", "/admin/status")["policy"]["generation"]
        r.send(signal.SIGHUP)
        r.wait_line(r"SIGHUP: policy reload refused", stream="err")
        self.assertEqual(r.json("GET", "/admin/status")["policy"]["generation"], g)
        self.assertEqual(self.pick(r)["worker_id"], 1)
        # POST /admin/reload does the same as SIGHUP
        with open(path, "w") as f:
            f.write(PICK_LAST)
        r.json("POST", "/admin/reload")
        self.assertEqual(self.pick(r)["worker_id"], 3)

    def test_on_response_hook_sees_outcomes(self):
        good = kvrh.FakeWorker()
        bad = kvrh.FakeWorker(lambda p, b: ("json", 503, b"{}"))
        self.addCleanup(good.stop)
        self.addCleanup(bad.stop)
        r = self.router()
        for wid in (1, 2, 3):
            r.json("POST", "/unregister", {"instance_id": wid})
        r.json("POST", "/register", {"instance_id": 1, "url": bad.url}, expect=201)
        r.json("POST", "/register", {"instance_id": 2, "url": good.url}, expect=201)
        r.json("POST", "/admin/policy", PICK_FIRST.replace("return best\nend }", """return best
end, on_response = function(req, worker, outcome)
  kvr.count(outcome.ok and "ok" or "failed")
  if outcome.ttft_ms then kvr.count("timed") end
end }"""))
        for _ in range(3):  # worker 1 answers 503: retried on worker 2
            self.assertEqual(r.request("POST", "/v1/completions", {"prompt": [1, 2, 3]})[0], 200)
        m = lambda n: r.metric("kvrouter_policy_user_counter_total", name=n)  # noqa: E731
        self.assertEqual((m("ok"), m("failed")), (3, 3))
        self.assertEqual(m("timed"), 3)

    def test_kv_event_hooks_see_every_event(self):
        # A policy that keeps its own state from KV events: every thread's VM gets each batch
        # applied over HTTP (/v1/events), whatever thread applied it.
        r = self.router("--threads", "2")
        r.json("POST", "/admin/policy", PICK_FIRST.replace("return best\nend }", """return best
end, on_stored = function(ev) kvr.count("stored_blocks", ev.n) kvr.count("stored_w" .. ev.id .. "_" .. ev.dp_rank) end,
on_removed = function(ev) kvr.count("removed_hashes", #ev.block_hashes) end,
on_cleared = function(ev) kvr.count("cleared") end }"""))
        events = [
            {"worker_id": 1, "event": {"event_id": 0, "data": {"stored": {"parent_hash": None,
             "blocks": [{"block_hash": 11, "tokens_hash": 1}, {"block_hash": 12, "tokens_hash": 2}]}}}},
            {"worker_id": 1, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [12]}}}},
            {"worker_id": 1, "event": {"event_id": 2, "data": "cleared"}},
        ]
        for _ in range(5):
            self.assertEqual(r.json("POST", "/v1/events", events)["applied"], 3)
        m = lambda n: r.metric("kvrouter_policy_user_counter_total", name=n)  # noqa: E731
        # two threads, each told of all 5 x 3 events
        kvrh.wait_until(lambda: m("cleared") == 10, what="hooks on both threads")
        self.assertEqual(m("stored_blocks"), 20)
        self.assertEqual(m("removed_hashes"), 10)
        self.assertEqual(m("stored_w1_0"), 10)
        self.assertEqual(r.metric("kvrouter_policy_kv_hook_batches_total"), 10)
        self.assertEqual(r.metric("kvrouter_policy_kv_hook_dropped_total"), 0)
        # A policy without hooks: nothing is copied or delivered any more.
        r.json("POST", "/admin/policy", PICK_FIRST)
        r.json("POST", "/v1/events", events)
        time.sleep(0.2)
        self.assertEqual(r.metric("kvrouter_policy_kv_hook_batches_total"), 10)

    def test_engine_queries_answer_for_the_request_model(self):
        # With two models, kvr.overlap_hashes / kvr.index_stats inside a policy answer from the
        # index of the model being routed, not from a process-wide one.
        r = self.router("--model", "m1", "--model", "m2")
        for model in ("m1", "m2"):
            r.json("POST", "/register", {"instance_id": 1, "url": "http://127.0.0.1:9",
                                         "model_name": model}, expect=201)
        ev = lambda n: [{"worker_id": 1, "event": {"event_id": 0, "data": {"stored": {  # noqa
            "parent_hash": None, "blocks": [{"block_hash": 100 + i, "tokens_hash": 7 + i}
                                            for i in range(n)]}}}}]
        self.assertEqual(r.json("POST", "/v1/events?model=m1", ev(3))["applied"], 1)
        self.assertEqual(r.json("POST", "/v1/events?model=m2", ev(5))["applied"], 1)
        probe = """return { select = function(req, c)
  local o = kvr.overlap_hashes({7, 8, 9, 10, 11}) or {}  -- nil in the install-time scratch state
  local st = kvr.index_stats() or { blocks = 0 }
  local tag = ({ ["m1:default"] = "m1", ["m2:default"] = "m2" })[req.model] or "other"
  kvr.count(tag .. "_overlap", o["1:0"] or 0)
  kvr.count(tag .. "_blocks", st.blocks)
  return c[1]
end }"""
        for model in ("m1", "m2"):
            r.json("POST", "/admin/policy?model=%s" % model, probe)
            route = r.json("POST", "/v1/route", {"model": model, "block_hashes": [7, 8]})
            self.assertEqual(route["worker_id"], 1)
            self.assertEqual(route["policy"], model + ".default")  # its own binding decided
        m = lambda n: r.metric("kvrouter_policy_user_counter_total", name=n)  # noqa: E731
        self.assertEqual((m("m1_overlap"), m("m1_blocks")), (3, 3))
        self.assertEqual((m("m2_overlap"), m("m2_blocks")), (5, 5))

    def test_policy_header_when_allowed(self):
        r = self.router("--allow-policy-header")
        r.json("POST", "/admin/policy", PICK_FIRST)
        d = r.json("POST", "/v1/route", {"token_ids": list(range(16)), "book": False,
                                         "headers": {"x-kvrouter-policy": "least_loaded"}})
        self.assertEqual(d["policy"], "least_loaded")
        self.assertEqual(self.pick(r)["policy"], "default")
        r2 = self.router()
        r2.json("POST", "/admin/policy", PICK_FIRST)
        d = r2.json("POST", "/v1/route", {"token_ids": list(range(16)), "book": False,
                                          "headers": {"x-kvrouter-policy": "least_loaded"}})
        self.assertEqual(d["policy"], "default")  # not allowed: ignored


if __name__ == "__main__":
    unittest.main(verbosity=2)
