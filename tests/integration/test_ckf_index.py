#!/usr/bin/python3
"""The CKF index kinds of kvrouter (index=ckf|both, docs/CKF.md, docs/SERVER.md §4) fed by events
whose block hashes are the ENGINE's own opaque ids, as vLLM and SGLang publish them: the CKF keys
on Dynamo sequence hashes, so the server must translate (default ckf_keys=translate) or it
matches nothing.

- /query_by_hash and /v1/route score the worker on a CKF-only model exactly like the radix
  model fed the same events (stores with parents, a removal by engine hash, a re-store);
- a BOTH model's CKF side (kvr.lanes in a policy) answers the same depths;
- ckf_keys=engine takes block_hash as the sequence hash: with opaque hashes it matches nothing
  (the old behaviour, now only on request);
- ckf_expected sizes the filter: the index bytes differ by exactly the smaller level 0;
- the mock worker (whose engine hashes are Dynamo sequence hashes) over real ZMQ still matches
  with the translating CKF.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 4
# local block hashes (what the router computes from tokens; queries may pass them directly)
L = [0x1111000000000001 + i * 0x10001 for i in range(6)]
# the engines' opaque block ids: unrelated to L and to the sequence hashes, different per worker
E5 = [0xE5E5000000000000 + i * 7919 for i in range(6)]
E6 = [0xE6E6000000000000 + i * 104729 for i in range(6)]
E7 = [0xE7E7000000000000 + 3]

LANES_POLICY = """
-- picks the candidate with the SMALLEST positive CKF lane depth (kvr.lanes); with no lane
-- answer at all, the last candidate: a test can tell the CKF side's answer from the radix's
local function select(req, candidates)
  local lanes = kvr.lanes(req) or {}
  local best, bd = nil, math.huge
  for _, c in ipairs(candidates) do
    local d = lanes[c.key] or 0
    if d > 0 and d < bd then best, bd = c, d end
  end
  return best or candidates[#candidates]
end
return { select = select }
"""


def stored(worker, parent, blocks, eid):
    return {"worker_id": worker, "event": {"event_id": eid, "dp_rank": 0, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}}}


def removed(worker, hashes, eid):
    return {"worker_id": worker, "event": {"event_id": eid, "dp_rank": 0, "data": {
        "removed": {"block_hashes": hashes}}}}


class CkfIndexKinds(unittest.TestCase):
    def setUp(self):
        self.procs = []

    def tearDown(self):
        for p in reversed(self.procs):
            self.assertEqual(p.stop(), 0, p.stderr())

    def feed(self, r, model, events):
        got = r.json("POST", "/v1/events?model=%s" % model, events)
        self.assertEqual(got["rejected"], [], (model, got))
        self.assertEqual(got["applied"], len(events))

    def scores(self, r, model, hashes):
        s = r.json("POST", "/query_by_hash", {"block_hashes": hashes, "model_name": model})
        return {int(w): ranks.get("0", 0) // BS for w, ranks in s["scores"].items()}

    def test_opaque_engine_hashes(self):
        tmp = kvrh.tmpdir()
        policy = os.path.join(tmp, "lanes.lua")
        with open(policy, "w") as f:
            f.write(LANES_POLICY)
        models = ["ckf,index=ckf", "both,index=both,policy=" + policy,
                  "eng,index=ckf,ckf_keys=engine", "rad,index=radix",
                  "small,index=ckf,ckf_expected=4096"]
        args = ["--block-size", BS, "--health-interval", "0"]
        for m in models:
            args += ["--model", m]
        for m in ("ckf", "both"):
            for w in (5, 6, 7):
                args += ["--worker", "id=%d,model=%s,url=http://127.0.0.1:9" % (w, m)]
        r = kvrh.Router(*args)
        self.procs.append(r)
        names = ("ckf", "both", "eng", "rad", "small")
        for m in names:
            self.feed(r, m, [
                stored(5, None, [(E5[0], L[0]), (E5[1], L[1]), (E5[2], L[2])], 1),
                stored(5, E5[2], [(E5[3], L[3])], 2),  # the parent is an engine hash
                stored(6, None, [(E6[0], L[0])], 1),
                stored(7, None, [(E7[0], L[5])], 1),
            ])
        q = L[:5]
        want = {5: 4, 6: 1}
        for m in ("ckf", "rad", "small", "both"):
            self.assertEqual(self.scores(r, m, q), want, m)
        # engine keys: block_hash taken as the sequence hash; opaque ids match nothing
        self.assertEqual(self.scores(r, "eng", q), {})
        # a removal names the engine hash; the CKF translates it back
        for m in names:
            self.feed(r, m, [removed(5, [E5[3]], 3)])
        for m in ("ckf", "rad"):
            self.assertEqual(self.scores(r, m, q), {5: 3, 6: 1}, m)
        # the engine re-stores the block under a new id
        for m in names:
            self.feed(r, m, [stored(5, E5[2], [(E5[4], L[3])], 4)])
        for m in ("ckf", "rad", "small"):
            self.assertEqual(self.scores(r, m, q), want, m)
        for m in ("ckf", "both", "small"):
            for err in ("ParentBlockNotFound", "BlockNotFound"):
                self.assertEqual(r.metric("kvrouter_index_event_errors_total", model=m + ":default",
                                          error=err), 0, (m, err))
        # routing on the CKF-only model follows the CKF's overlap
        route = r.json("POST", "/v1/route", {"model": "ckf", "block_hashes": q})
        self.assertEqual((route["worker_id"], route["overlap_blocks"]), (5, 4))
        # the BOTH model's CKF side: the lanes policy sees depths 4 and 1 and picks worker 6
        # (without translation it saw none and picked the last candidate, 7)
        route = r.json("POST", "/v1/route", {"model": "both", "block_hashes": q})
        self.assertEqual(route["worker_id"], 6, route)
        # ckf_expected=4096: level 0 has 1024 buckets instead of 4096, in each of the group's 4
        # lanes (3 ranks), 8 bytes per bucket; the exact sides hold the same entries (their
        # accounted bytes may differ by a few malloc-rounding bytes: the models' events were
        # applied on different threads)
        big = r.metric("kvrouter_index_bytes", model="ckf:default")
        small = r.metric("kvrouter_index_bytes", model="small:default")
        self.assertAlmostEqual(big - small, 4 * (4096 - 1024) * 8, delta=256)

    def test_mock_worker_over_zmq(self):
        """The mock publishes Dynamo sequence hashes as its engine hashes: translation
        recomputes exactly those, so the translating CKF matches them too."""
        w = kvrh.MockWorker("--prefill-us", "0", "--decode-us", "0", block_size=16)
        self.procs.append(w)
        r = kvrh.Router("--block-size", 16, "--health-interval", "0",
                        "--model", "default,index=ckf")
        self.procs.append(r)
        r.json("POST", "/register", {"instance_id": 3, "url": w.url, "endpoint": w.zmq,
                                     "block_size": 16}, expect=201)
        kvrh.wait_until(lambda: "kvr_mock_zmq_subscriptions_total 1" in
                        w.request("GET", "/metrics")[2].decode(), what="subscription")
        tokens = [7000 + i for i in range(5 * 16)]
        st, _, data = r.request("POST", "/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(st, 200, data)

        def depth():
            s = r.json("POST", "/query", {"token_ids": tokens})["scores"]
            return s.get("3", {}).get("0", 0) // 16
        kvrh.wait_until(lambda: depth() == 5, what="the mock's events in the CKF")
        self.assertEqual(r.metric("kvrouter_index_event_errors_total", model="default:default",
                                  error="ParentBlockNotFound"), 0)


if __name__ == "__main__":
    unittest.main()
