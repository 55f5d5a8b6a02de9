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
        r.wait_line(r"SIGHUP: policies reloaded", stream="err")  # install and bind both done
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

    # ==== operator scripts (POST /admin/script) ===============================================

    def test_operator_scripts(self):
        d = kvrh.tmpdir()
        r = self.router("--snapshot", os.path.join(d, "snap.bin"), "--script-budget", "300ms")
        self.assertEqual(r.json("POST", "/admin/script", "return 1 + 1"), {"result": "2"})
        e = r.json("POST", "/admin/script", "return (", expect=400)
        self.assertIn("script.lua:1:", e["error"])
        self.assertEqual(e["status"], "errsyntax")
        e = r.json("POST", "/admin/script", "local t = nil\nreturn t.x", expect=400)
        self.assertIn("script.lua:2:", e["error"])
        self.assertEqual(e["status"], "errrun")
        e = r.json("POST", "/admin/script", "while true do end", expect=408)
        self.assertEqual(e["status"], "etimedout")
        self.assertEqual(r.post("/admin/script", b"")[0], 400)
        # the engine: the index's stats, a dump and a snapshot, only inside the snapshot directory
        ev = [{"worker_id": 1, "event": {"event_id": 0, "data": {"stored": {"parent_hash": None,
               "blocks": [{"block_hash": 100 + i, "tokens_hash": 7 + i} for i in range(3)]}}}}]
        self.assertEqual(r.json("POST", "/v1/events", ev)["applied"], 1)
        res = r.json("POST", "/admin/script", """
local ok, err = kvr.admin.snapshot("copy.bin")
assert(ok, err)
assert(kvr.admin.dump("dump.json"))
return kvr.index_stats().blocks
""")
        self.assertEqual(res, {"result": "3"})
        self.assertGreater(os.path.getsize(os.path.join(d, "copy.bin")), 0)
        with open(os.path.join(d, "dump.json")) as f:
            dump = json.load(f)
        (model,) = dump.keys()
        self.assertEqual(len(dump[model]["events"]), 1)
        res = r.json("POST", "/admin/script",
                     "local ok, err = kvr.admin.dump('/tmp/kvr-outside.json') return err")
        self.assertIn("may only be written in " + d, res["result"])
        self.assertFalse(os.path.exists("/tmp/kvr-outside.json"))
        self.assertEqual(r.metric("kvrouter_policy_scripts_total"), 6)
        # policies never get kvr.admin
        e = r.json("POST", "/admin/policy", "kvr.admin.dump('x')\nreturn {select=function(r, c) "
                   "return c[1] end}", expect=400)
        self.assertIn("admin", e["error"])

    def test_operator_scripts_are_admin_only(self):
        r = kvrh.Router("--block-size", "4", token="0123456789abcdef-token")
        self.addCleanup(lambda: self.assertEqual(r.stop(), 0, r.stderr()))
        st, _, _ = r.request("POST", "/admin/script", "return 1", auth=False)
        self.assertEqual(st, 401)
        self.assertEqual(r.json("POST", "/admin/script", "return 'x'"), {"result": "x"})

    # ==== --policy-dev ===========================================================================

    def test_policy_dev_reinstalls_a_changed_file(self):
        d = kvrh.tmpdir()
        path = os.path.join(d, "dev.lua")
        with open(path, "w") as f:
            f.write(PICK_LAST)
        r = self.router("--policy", path, "--policy-dev")
        self.assertEqual(self.pick(r)["worker_id"], 3)

        def rewrite(text, bump):
            with open(path, "w") as f:
                f.write(text)
            st = os.stat(path)  # a distinct mtime even on a coarse file-system clock
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1000000000))

        rewrite(PICK_FIRST, 1)
        kvrh.wait_until(lambda: self.pick(r)["worker_id"] == 1, what="--policy-dev reload")
        self.assertEqual(r.metric("kvrouter_policy_dev_reloads_total"), 1)
        rewrite("return {", 2)  # broken: refused and logged, the previous version stays
        r.wait_line(r"--policy-dev: .*dev.lua changed but was refused", stream="err")
        self.assertEqual(self.pick(r)["worker_id"], 1)
        rewrite(PICK_LAST, 3)
        kvrh.wait_until(lambda: self.pick(r)["worker_id"] == 3, what="--policy-dev reload")
        self.assertEqual(r.metric("kvrouter_policy_dev_reloads_total"), 2)
        # without --policy-dev nothing is watched
        path2 = os.path.join(d, "still.lua")
        with open(path2, "w") as f:
            f.write(PICK_LAST)
        r2 = self.router("--policy", path2)
        with open(path2, "w") as f:
            f.write(PICK_FIRST)
        time.sleep(0.6)
        self.assertEqual(self.pick(r2)["worker_id"], 3)

    # ==== trusted policy files and the stuck-call watchdog ======================================

    LOOPY = """return { select = function(req, c)
  if req.headers["x-loop"] then local x = 0 while true do x = x + 1 end end
  local best = c[1]
  for i = 2, #c do if c[i].id < best.id then best = c[i] end end
  return best
end }
"""

    def test_trusted_file_stuck_call_is_interrupted(self):
        d = kvrh.tmpdir()
        path = os.path.join(d, "loopy.lua")
        with open(path, "w") as f:
            f.write(self.LOOPY)
        r = self.router("--policy", path, "--policy-trusted", "--policy-stuck-after", "300ms",
                        "--threads", "2")
        pol = {p["name"]: p for p in r.json("GET", "/admin/status")["policy"]["policies"]}
        self.assertTrue(pol["loopy"]["trusted"])
        self.assertEqual(self.pick(r)["worker_id"], 1)
        out = {}

        def stuck():
            out["r"] = r.request("POST", "/v1/route", {"token_ids": list(range(16)),
                                 "book": False, "headers": {"x-loop": "1"}}, timeout=60)

        th = threading.Thread(target=stuck)
        th.start()
        seen = []

        def not_ready():
            try:
                st, _, body = r.request("GET", "/readyz", timeout=2)
            except OSError:  # landed on the stuck thread
                return False
            seen.append((st, body))
            return st == 503 and b"policy_stuck" in body

        kvrh.wait_until(not_ready, what="/readyz 503 while a thread is stuck")
        th.join(60)
        st, _, body = out["r"]
        self.assertEqual(st, 200, body)
        route = json.loads(body)
        self.assertTrue(route["fallback"])  # the interrupted decision: the built-in policy
        kvrh.wait_until(lambda: r.get("/readyz")[0] == 200, what="ready again")
        self.assertEqual(r.metric("kvrouter_policy_interrupted_total"), 1)
        self.assertGreaterEqual(r.metric("kvrouter_policy_stuck_calls_total"), 1)
        self.assertEqual(r.metric("kvrouter_policy_stuck_threads"), 0)
        self.assertIn("has been in one call of policy loopy", r.stderr())
        self.assertIn("rebuilt its Lua state after an interrupted call", r.stderr())
        for _ in range(4):  # every thread serves the policy again
            p = self.pick(r)
            self.assertEqual((p["worker_id"], p["policy"], p["fallback"]), (1, "loopy", False))
        # Without --policy-trusted the same file runs sandboxed: the time budget stops the loop.
        r2 = self.router("--policy", path)
        pol = {p["name"]: p for p in r2.json("GET", "/admin/status")["policy"]["policies"]}
        self.assertFalse(pol["loopy"]["trusted"])
        route = r2.json("POST", "/v1/route", {"token_ids": list(range(16)), "book": False,
                                              "headers": {"x-loop": "1"}})
        self.assertTrue(route["fallback"])
        self.assertEqual(r2.metric("kvrouter_policy_lua_timeouts_total", policy="loopy"), 1)
        self.assertEqual(r2.metric("kvrouter_policy_interrupted_total"), 0)

    def test_fields_the_server_cannot_fill_are_inert(self):
        # docs/LUA_API.md "What the server fills": no source for these in the router.
        r = self.router()
        r.json("POST", "/admin/policy", """return { select = function(req, c)
  for i = 1, #c do
    local x = c[i]
    if req.model ~= "synthetic-model" and (x.kv_usage ~= nil or x.queue ~= 0 or
        x.overlap_host ~= 0 or x.overlap_disk ~= 0 or x.weight ~= 1) then
      error("not inert: " .. tostring(x.kv_usage) .. " " .. x.queue)
    end
  end
  return c[1]
end }""")
        self.assertFalse(self.pick(r)["fallback"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
