"""Routing as a service: POST /v1/route with token_ids / block_hashes / text / messages, the
booked load and its lifecycle (/v1/route/{id}/first_token, DELETE /v1/route/{id}), per-candidate
scores, approximate mode (the router records its own decisions), 503 without workers."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

L0, L1 = 9143094415614847814, 12124091508212882195  # tokens 0..7, block size 4


def stored(worker, parent, blocks, rank=0):
    return {"worker_id": worker, "event": {"event_id": 1, "dp_rank": rank, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}}}


class RouteApi(unittest.TestCase):
    def setUp(self):
        self.r = kvrh.Router("--block-size", "4", "--health-interval", "0")

    def tearDown(self):
        self.assertEqual(self.r.stop(), 0, self.r.stderr())

    def register(self, wid, rank=0, url=None):
        body = {"instance_id": wid, "dp_rank": rank, "url": url or "http://127.0.0.1:9"}
        self.r.json("POST", "/register", body, expect=201)

    def test_no_worker_is_503(self):
        e = self.r.json("POST", "/v1/route", {"token_ids": [1, 2, 3]}, expect=503)
        self.assertIn("no worker", e["error"])
        self.r.json("POST", "/v1/route", {"model": "nope", "token_ids": [1]}, expect=404)
        e = self.r.json("POST", "/v1/route", {"model": "default"}, expect=400)
        self.assertIn("token_ids", e["error"])

    def test_overlap_decides_and_load_is_booked(self):
        r = self.r
        self.register(7)
        self.register(8)
        self.register(8, rank=1)
        r.json("POST", "/v1/events", [stored(8, None, [(1, L0), (2, L1)], rank=1)])
        d = r.json("POST", "/v1/route", {"token_ids": list(range(9)), "scores": True})
        for k in ("worker_id", "dp_rank", "url", "overlap_blocks", "request_id"):
            self.assertIn(k, d)
        self.assertEqual((d["worker_id"], d["dp_rank"], d["overlap_blocks"]), (8, 1, 2))
        self.assertEqual(d["url"], "http://127.0.0.1:9")
        self.assertEqual(d["required_blocks"], 2)
        self.assertTrue(d["booked"])
        cands = {(c["worker_id"], c["dp_rank"]): c for c in d["candidates"]}
        self.assertEqual(set(cands), {(7, 0), (8, 0), (8, 1)})
        self.assertEqual(cands[(8, 1)]["overlap_blocks"], 2)
        self.assertEqual(cands[(7, 0)]["overlap_blocks"], 0)
        # classic cost (scheduling.md §3): isl 9, bs 4: (9 - 8)/4 + 2 new blocks = 2.25
        self.assertAlmostEqual(cands[(8, 1)]["cost"], 2.25)
        self.assertAlmostEqual(cands[(7, 0)]["cost"], 9 / 4 + 2)
        # the booking shows up as load on (8, 1): its prefill tokens and active blocks
        d2 = r.json("POST", "/v1/route", {"block_hashes": [L0, L1], "isl": 8, "scores": True,
                                          "book": False})
        c2 = {(c["worker_id"], c["dp_rank"]): c for c in d2["candidates"]}
        self.assertEqual(c2[(8, 1)]["requests"], 1)
        self.assertEqual(c2[(8, 1)]["prefill_tokens"], 1)  # 9 - 2*4
        self.assertEqual(c2[(8, 1)]["decode_blocks"], 2)
        self.assertEqual(c2[(8, 1)]["new_blocks"], 0)
        self.assertFalse(d2["booked"])
        rid = d["request_id"]
        self.assertEqual(r.metric("kvrouter_load_active_requests", worker_id="8", dp_rank="1"), 1)
        r.json("POST", "/v1/route/%d/first_token" % rid)
        c3 = {(c["worker_id"], c["dp_rank"]): c for c in r.json(
            "POST", "/v1/route", {"block_hashes": [L0], "scores": True, "book": False})["candidates"]}
        self.assertEqual(c3[(8, 1)]["prefill_tokens"], 0)
        self.assertEqual(c3[(8, 1)]["requests"], 1)
        r.json("DELETE", "/v1/route/%d" % rid)
        r.json("DELETE", "/v1/route/%d" % rid, expect=404)
        r.json("POST", "/v1/route/%d/first_token" % rid, expect=404)
        r.json("POST", "/v1/route/123/free", expect=404)
        self.assertEqual(r.metric("kvrouter_load_active_requests", worker_id="8", dp_rank="1"), 0)
        # the alternative lifecycle path
        d4 = r.json("POST", "/v1/route", {"token_ids": [1, 2, 3, 4]})
        r.json("POST", "/v1/route/%d/free" % d4["request_id"])

    def test_load_spreads_without_overlap(self):
        r = self.r
        self.register(1)
        self.register(2)
        picks = []
        for i in range(6):
            picks.append(r.json("POST", "/v1/route", {"token_ids": list(range(100 * i, 100 * i + 64))})[
                "worker_id"])
        self.assertEqual(sorted(picks), [1, 1, 1, 2, 2, 2])

    def test_text_and_messages_with_the_bytes_tokenizer(self):
        r = kvrh.Router("--model", "m,block_size=4,kind=approx,tokenizer=bytes",
                        "--health-interval", "0")
        try:
            r.json("POST", "/register", {"instance_id": 1, "model_name": "m", "url": "http://127.0.0.1:9"},
                   expect=201)
            r.json("POST", "/register", {"instance_id": 2, "model_name": "m", "url": "http://127.0.0.1:9"},
                   expect=201)
            text = "The quick brown fox jumps over the lazy dog, again and again."
            d1 = r.json("POST", "/v1/route", {"model": "m", "text": text})
            self.assertEqual(d1["overlap_blocks"], 0)
            self.assertEqual(d1["isl_tokens"], (len(text) + 3) // 4)
            r.json("DELETE", "/v1/route/%d" % d1["request_id"])
            # approximate mode recorded the first decision: the same prefix goes back there
            d2 = r.json("POST", "/v1/route", {"model": "m", "text": text + " And more."})
            self.assertEqual(d2["worker_id"], d1["worker_id"])
            self.assertEqual(d2["overlap_blocks"], len(text) // 4 // 4)
            dump = r.json("GET", "/dump")
            self.assertGreater(len(dump["m:default"]["events"]), 0)
            msgs = [{"role": "user", "content": "hello there " * 10}]
            d3 = r.json("POST", "/v1/route", {"model": "m", "messages": msgs})
            d4 = r.json("POST", "/v1/route", {"model": "m", "messages": msgs + [
                {"role": "assistant", "content": "hi"}]})
            self.assertEqual(d4["worker_id"], d3["worker_id"])
            self.assertGreater(d4["overlap_blocks"], 0)
            self.assertGreaterEqual(r.metric("kvrouter_approx_recorded_total"), 4)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())

    def test_text_through_the_worker_tokenizer(self):
        w = kvrh.MockWorker(block_size=4, zmq=False)
        r = kvrh.Router("--block-size", "4", "--health-interval", "0")
        try:
            r.json("POST", "/register", {"instance_id": 5, "url": w.url}, expect=201)
            st, _, tok = w.request("POST", "/tokenize", {"prompt": "a b c d e f g h i"})
            tokens = __import__("json").loads(tok)["tokens"]
            r.json("POST", "/v1/events", [stored(5, None, [(1, 0)])])  # a dummy, not matching
            d = r.json("POST", "/v1/route", {"text": "a b c d e f g h i", "scores": True})
            self.assertEqual(d["isl_tokens"], len(tokens))
            self.assertEqual(d["required_blocks"], len(tokens) // 4)
            self.assertEqual(r.metric("kvrouter_tokenize_total", source="worker", result="ok"), 1)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())
            w.stop()

    def test_unhealthy_workers_are_not_candidates(self):
        r = kvrh.Router("--block-size", "4", "--health-interval", "100ms", "--health-fails", "1",
                        "--health-timeout", "200ms")
        fw = kvrh.FakeWorker()
        try:
            r.json("POST", "/register", {"instance_id": 1, "url": "http://127.0.0.1:%d" % kvrh.free_port()},
                   expect=201)
            r.json("POST", "/register", {"instance_id": 2, "url": fw.url}, expect=201)
            kvrh.wait_until(lambda: r.metric("kvrouter_worker_healthy", worker_id="1") == 0,
                            what="worker 1 unhealthy")
            for _ in range(5):
                self.assertEqual(r.json("POST", "/v1/route", {"token_ids": [1, 2, 3, 4]})["worker_id"], 2)
            fw.stop()
            kvrh.wait_until(lambda: r.metric("kvrouter_worker_healthy", worker_id="2") == 0,
                            what="worker 2 unhealthy")
            e = r.json("POST", "/v1/route", {"token_ids": [1, 2, 3, 4]}, expect=503)
            self.assertIn("eligible", e["error"])
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())

    def test_proxied_requests_cannot_be_freed_through_the_route_api(self):
        # a request the router proxies itself books load under an id of the same space; the
        # lifecycle routes refuse it (409) and its booking stays until the stream ends
        import http.client
        fw = kvrh.FakeWorker(lambda p, b: ("sse", [b"data: 1\n\n", b"data: 2\n\n"], 0.6))
        try:
            self.register(1, url=fw.url)
            c = http.client.HTTPConnection("127.0.0.1", self.r.port, timeout=30)
            c.request("POST", "/v1/completions", body='{"prompt": [1, 2, 3, 4], "stream": true}',
                      headers={"Content-Type": "application/json"})
            resp = c.getresponse()  # the head: the stream has started, the booking is live
            self.assertEqual(resp.status, 200)
            rid = int(resp.getheader("x-kvrouter-request-id"))
            self.assertEqual(self.r.metric("kvrouter_load_active_requests", worker_id="1"), 1)
            for method, path in (("DELETE", "/v1/route/%d" % rid),
                                 ("POST", "/v1/route/%d/free" % rid),
                                 ("POST", "/v1/route/%d/first_token" % rid)):
                e = self.r.json(method, path, expect=409)
                self.assertIn("proxy", e["error"])
            self.assertEqual(self.r.metric("kvrouter_load_active_requests", worker_id="1"), 1)
            self.assertEqual(resp.read(), b"data: 1\n\ndata: 2\n\n")
            c.close()
            kvrh.wait_until(lambda: self.r.metric("kvrouter_load_active_requests", worker_id="1")
                            == 0, what="the proxied booking freed at the end")
            # ids handed out by /v1/route stay free-able, and differ from the proxy's
            d = self.r.json("POST", "/v1/route", {"token_ids": [1, 2, 3, 4]})
            self.assertNotEqual(d["request_id"], rid)
            self.r.json("DELETE", "/v1/route/%d" % d["request_id"])
            self.assertLess(max(d["request_id"], rid), 2 ** 53)
        finally:
            fw.stop()

    def test_lora_header_changes_the_hashes(self):
        # x-kvrouter-lora on the HTTP request salts the block hashes, as in the proxy; the body's
        # lora_name wins over the header
        r = self.r
        self.register(1)
        r.json("POST", "/v1/events", [stored(1, None, [(1, L0), (2, L1)])])
        for body in ({"token_ids": list(range(8)), "book": False},  # fast path
                     {"token_ids": list(range(8)), "book": False, "temperature": 0}):  # strict
            with self.subTest(body=body):
                self.assertEqual(r.json("POST", "/v1/route", body)["overlap_blocks"], 2)
                d = r.json("POST", "/v1/route", body, headers={"x-kvrouter-lora": "adapter-a"})
                self.assertEqual(d["overlap_blocks"], 0)
        d = r.json("POST", "/v1/route", {"token_ids": list(range(8)), "book": False,
                                         "lora_name": "adapter-a"})
        self.assertEqual(d["overlap_blocks"], 0)


# the candidate named by the session key, else by the x-pick header, else the lowest id
PICK_BY_SESSION = """return { select = function(req, c)
  local want = tonumber(req.session or "") or tonumber(req.headers["x-pick"] or "")
  local best = c[1]
  for i = 1, #c do
    if c[i].id == want then return c[i] end
    if c[i].id < best.id then best = c[i] end
  end
  return best
end }
"""


class RouteHeaders(unittest.TestCase):
    """/v1/route reads the HTTP request's own session and x-* headers (as the proxy does), in
    both its fast and its strict body paths; body fields win over headers."""

    def setUp(self):
        self.r = kvrh.Router("--block-size", "4", "--health-interval", "0")
        self.addCleanup(lambda: self.assertEqual(self.r.stop(), 0, self.r.stderr()))
        if self.r.json("GET", "/admin/status")["policy"]["runtime"] != "lua":
            self.skipTest("this build has no Lua policy runtime")
        for wid in (1, 2, 3):
            self.r.json("POST", "/register", {"instance_id": wid, "url": "http://127.0.0.1:9"},
                        expect=201)
        self.r.json("POST", "/admin/policy", PICK_BY_SESSION)

    def pick(self, extra=None, **kw):
        body = {"token_ids": list(range(16)), "book": False}
        body.update(extra or {})
        return self.r.json("POST", "/v1/route", body, **kw)["worker_id"]

    def test_session_and_routing_headers(self):
        for extra in (None, {"temperature": 0}):  # fast path, strict path
            with self.subTest(extra=extra):
                self.assertEqual(self.pick(extra), 1)
                self.assertEqual(self.pick(extra, headers={"x-pick": "3"}), 3)
                self.assertEqual(self.pick(extra, headers={"X-Pick": "2"}), 2)
                for h in ("x-session-id", "x-kvrouter-session", "x-dynamo-session-id"):
                    self.assertEqual(self.pick(extra, headers={h: "2", "x-pick": "3"}), 2, h)
        # the body's session and headers come first; the HTTP headers fill in the rest
        self.assertEqual(self.pick({"session_id": "3"}, headers={"x-session-id": "2"}), 3)
        self.assertEqual(self.pick({"headers": {"x-session-id": "1"}},
                                   headers={"x-session-id": "2"}), 1)
        self.assertEqual(self.pick({"headers": {"x-other": "1"}}, headers={"x-pick": "2"}), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
