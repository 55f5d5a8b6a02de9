"""Worker management: POST /v1/workers, GET /v1/workers[/{id}], 409 on a duplicate, DELETE
/v1/workers/{id} (and the body form), request errors; removing a worker (DELETE /v1/workers/{id}
or the indexer's POST /unregister) removes its index state (/query and /query_by_hash scores and
tree sizes, /dump) and its booked load (kvrouter_load_* gauges, the candidates' load terms).

Runs on loopback without an admin token (loopback stays allowed then)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

L0, L1 = 9143094415614847814, 12124091508212882195  # tokens 0..7, block size 4
URL = "http://127.0.0.1:9"


def stored(worker, parent, blocks, rank=0):
    return {"worker_id": worker, "event": {"event_id": 1, "dp_rank": rank, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}}}


class WorkersApi(unittest.TestCase):
    def setUp(self):
        self.r = kvrh.Router("--block-size", "4", "--health-interval", "0")

    def tearDown(self):
        self.assertEqual(self.r.stop(), 0, self.r.stderr())

    def test_crud(self):
        r = self.r
        self.assertEqual(r.json("GET", "/v1/workers"), {"workers": []})
        body = {"id": 5, "url": URL, "dp_size": 2, "labels": {"zone": "a", "gpu": "h100"}}
        d = r.json("POST", "/v1/workers", body, expect=201)
        self.assertEqual(d["status"], "ok")
        w = d["worker"]
        self.assertEqual((w["id"], w["url"], w["dp_size"], w["model"]), (5, URL, 2, "default:default"))
        self.assertEqual([k["dp_rank"] for k in w["ranks"]], [0, 1])
        self.assertEqual(w["labels"], {"zone": "a", "gpu": "h100"})
        self.assertEqual(w["health"], "healthy")
        # GET by id and in the list: the same record
        self.assertEqual(r.json("GET", "/v1/workers/5"), w)
        self.assertEqual(r.json("GET", "/v1/workers")["workers"], [w])
        self.assertEqual(r.json("GET", "/v1/workers?model=default")["workers"], [w])
        r.json("GET", "/v1/workers/6", expect=404)
        r.json("GET", "/v1/workers/abc", expect=404)
        r.json("GET", "/v1/workers?model=nope", expect=404)
        # a duplicate is a conflict and changes nothing
        e = r.json("POST", "/v1/workers", {"id": 5, "url": "http://127.0.0.1:10"}, expect=409)
        self.assertIn("5", e["error"])
        self.assertEqual(r.json("GET", "/v1/workers/5")["url"], URL)
        # the indexer view lists it as well (ZMQ endpoints only: none here)
        self.assertEqual([x["instance_id"] for x in r.json("GET", "/workers")], [5])
        # a second worker on another model (created on the fly, with its block size)
        d2 = r.json("POST", "/v1/workers", {"id": 9, "model": "m2:t1", "url": URL,
                                            "block_size": 8}, expect=201)
        self.assertEqual(d2["worker"]["model"], "m2:t1")
        self.assertEqual([x["id"] for x in r.json("GET", "/v1/workers?model=m2:t1")["workers"]],
                         [9])
        self.assertEqual(sorted(x["id"] for x in r.json("GET", "/v1/workers")["workers"]), [5, 9])
        # request errors
        for bad, frag in (({"id": 7}, "url"),
                          ({"id": 7, "url": URL, "dp_size": 0}, "dp_size"),
                          ({"id": 7, "url": URL, "labels": {"a": 1}}, "labels.a"),
                          ({"id": 7, "url": URL, "labels": {"a,b": "c"}}, "labels"),
                          ({"id": "x", "url": URL}, "id"),
                          ([1, 2], "object")):
            with self.subTest(body=bad):
                e = r.json("POST", "/v1/workers", bad, expect=400)
                self.assertIn(frag, e["error"])
        st, _, _ = r.request("POST", "/v1/workers", b"{not json")
        self.assertEqual(st, 400)
        st, hdrs, _ = r.request("POST", "/v1/workers/5", {})
        self.assertEqual(st, 405)
        self.assertEqual(sorted(x["id"] for x in r.json("GET", "/v1/workers")["workers"]), [5, 9])
        # DELETE by id, then it is gone; again: 404
        self.assertEqual(r.json("DELETE", "/v1/workers/5"), {"status": "ok", "removed": 1})
        r.json("GET", "/v1/workers/5", expect=404)
        r.json("DELETE", "/v1/workers/5", expect=404)
        self.assertEqual([x["instance_id"] for x in r.json("GET", "/workers")], [9])
        # DELETE with a body naming the model; a wrong model is a 404 and removes nothing
        r.json("DELETE", "/v1/workers", {"id": 9, "model": "nope"}, expect=404)
        r.json("DELETE", "/v1/workers", {"id": 9, "model": "default"}, expect=404)
        self.assertEqual(r.json("DELETE", "/v1/workers", {"id": 9, "model": "m2:t1"}),
                         {"status": "ok", "removed": 1})
        self.assertEqual(r.json("GET", "/v1/workers"), {"workers": []})
        self.assertEqual(r.json("GET", "/workers"), [])
        # the id can be registered again after removal
        r.json("POST", "/v1/workers", {"id": 5, "url": URL}, expect=201)
        self.assertEqual(r.json("GET", "/v1/workers/5")["dp_size"], 1)

    def setup_two(self):
        """Workers 7 (via /register, holding [L0, L1]) and 8 (via POST /v1/workers, holding [L0]);
        one booked request on each. Returns the request ids by worker."""
        r = self.r
        r.json("POST", "/register", {"instance_id": 7, "url": URL}, expect=201)
        r.json("POST", "/v1/workers", {"id": 8, "url": URL}, expect=201)
        res = r.json("POST", "/v1/events", [stored(7, None, [(1, L0), (2, L1)]),
                                             stored(8, None, [(11, L0)])])
        self.assertEqual(res, {"applied": 2, "rejected": []})
        q = r.json("POST", "/query_by_hash", {"block_hashes": [L0, L1]})
        self.assertEqual(q["scores"], {"7": {"0": 8}, "8": {"0": 4}})
        self.assertEqual(q["tree_sizes"], {"7": {"0": 2}, "8": {"0": 1}})
        self.assertEqual(r.json("POST", "/query", {"token_ids": list(range(8))})["scores"],
                         {"7": {"0": 8}, "8": {"0": 4}})
        ids = {}
        # one booked request on each: [L0, L1] goes to 7 (2 blocks of overlap); then [L0]
        # matches both, and 7 already carries a booking, so 8 gets it
        for wid, hashes in ((7, [L0, L1]), (8, [L0])):
            d = r.json("POST", "/v1/route", {"block_hashes": hashes})
            self.assertEqual(d["worker_id"], wid, d)
            ids[wid] = d["request_id"]
        return ids

    def booked(self, wid):
        return self.r.metric("kvrouter_load_active_requests", worker_id=str(wid))

    def test_delete_and_unregister_remove_scores_and_load(self):
        r = self.r
        ids = self.setup_two()
        self.assertEqual((self.booked(7), self.booked(8)), (1, 1))
        before = {w: r.metric("kvrouter_load_decode_blocks", worker_id=str(w)) for w in (7, 8)}
        self.assertEqual(before, {7: 2, 8: 1})
        # /unregister 7: its scores, tree sizes, dump events and booked load are gone
        r.json("POST", "/unregister", {"instance_id": 7})
        q = r.json("POST", "/query_by_hash", {"block_hashes": [L0, L1]})
        self.assertEqual(q["scores"], {"8": {"0": 4}})
        self.assertEqual(q["tree_sizes"], {"8": {"0": 1}})
        dump = r.json("GET", "/dump")["default:default"]["events"]
        self.assertEqual(sorted({e["worker_id"] for e in dump}), [8])
        self.assertIsNone(self.booked(7))
        self.assertIsNone(r.metric("kvrouter_load_decode_blocks", worker_id="7"))
        self.assertEqual(self.booked(8), 1)
        self.assertEqual(r.metric("kvrouter_load_decode_blocks", worker_id="8"), before[8])
        # worker 7's booking no longer exists
        freed_7 = r.request("DELETE", "/v1/route/%d" % ids[7])[0]
        self.assertEqual(freed_7, 404)
        # the candidates' load terms no longer count it: route with scores, no booking
        r.json("POST", "/register", {"instance_id": 7, "url": URL}, expect=201)
        c = {x["worker_id"]: x for x in r.json("POST", "/v1/route", {
            "block_hashes": [L0], "scores": True, "book": False})["candidates"]}
        self.assertEqual((c[7]["requests"], c[7]["overlap_blocks"], c[7]["tree_blocks"]), (0, 0, 0))
        # DELETE /v1/workers/8: the same for 8
        r.json("DELETE", "/v1/workers/8")
        q = r.json("POST", "/query_by_hash", {"block_hashes": [L0, L1]})
        self.assertEqual((q["scores"], q["tree_sizes"]), ({}, {}))
        self.assertEqual(r.json("POST", "/query", {"token_ids": list(range(8))})["scores"], {})
        self.assertEqual(r.json("GET", "/dump")["default:default"]["events"], [])
        self.assertIsNone(self.booked(8))
        self.assertIsNone(r.metric("kvrouter_load_prefill_tokens", worker_id="8"))
        self.assertEqual(r.request("DELETE", "/v1/route/%d" % ids[8])[0], 404)
        self.assertEqual(r.metric("kvrouter_load_active_requests"), None)

    def test_unregister_one_rank_keeps_the_others(self):
        r = self.r
        r.json("POST", "/v1/workers", {"id": 4, "url": URL, "dp_size": 2}, expect=201)
        r.json("POST", "/v1/events", [stored(4, None, [(1, L0)], rank=0),
                                      stored(4, None, [(2, L0), (3, L1)], rank=1)])
        self.assertEqual(r.json("POST", "/query_by_hash", {"block_hashes": [L0, L1]})["scores"],
                         {"4": {"0": 4, "1": 8}})
        r.json("POST", "/unregister", {"instance_id": 4, "dp_rank": 1})
        self.assertEqual(r.json("POST", "/query_by_hash", {"block_hashes": [L0, L1]})["scores"],
                         {"4": {"0": 4}})
        self.assertEqual([k["dp_rank"] for k in r.json("GET", "/v1/workers/4")["ranks"]], [0])
        r.json("POST", "/unregister", {"instance_id": 4, "dp_rank": 0})
        r.json("GET", "/v1/workers/4", expect=404)
        r.json("POST", "/unregister", {"instance_id": 4}, expect=404)


if __name__ == "__main__":
    unittest.main(verbosity=2)
