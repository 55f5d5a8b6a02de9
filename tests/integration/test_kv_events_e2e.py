#!/usr/bin/python3
"""End to end: kvrouter + mock workers over real ZMQ KV-event streams (issue 6).

- a prompt sent twice is routed to the same worker the second time, with overlap > 0, because the
  worker's events reached the index (both msgpack dialects: map and legacy arrays);
- a worker killed and restarted on the same endpoints: the router sees the publisher restart
  (sequence back to 0), clears that worker's rank, and rebuilds it from the new events;
- a dropped batch (never published live) is detected as a gap and fetched over the replay socket,
  so the index ends up exactly as if nothing had been lost; without a replay endpoint the loss is
  counted instead;
- per-worker subscriber metrics (batches, events by kind, gaps, replays, last sequence, dialect).
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 16


def prompt(base, blocks):
    return [base + i for i in range(blocks * BS)]


class KvEventsEndToEnd(unittest.TestCase):
    def setUp(self):
        self.procs = []

    def tearDown(self):
        for p in reversed(self.procs):
            p.stop()

    def router(self, *args):
        r = kvrh.Router("--block-size", BS, "--health-interval", "0", *args)
        self.procs.append(r)
        return r

    def worker(self, *args, port=0):
        w = kvrh.MockWorker("--prefill-us", "0", "--decode-us", "0", *args, port=port,
                            block_size=BS, zmq=False)
        self.procs.append(w)
        return w

    def register(self, r, wid, w, zmq, replay=None):
        body = {"instance_id": wid, "url": w.url, "endpoint": zmq, "block_size": BS}
        if replay:
            body["replay_endpoint"] = replay
        r.json("POST", "/register", body, expect=201)
        # Wait until the SUB socket is attached (the mock counts subscriptions).
        kvrh.wait_until(lambda: "kvr_mock_zmq_subscriptions_total 1" in
                        w.request("GET", "/metrics")[2].decode(), what="subscription")

    def complete(self, r, tokens):
        st, h, data = r.request("POST", "/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(st, 200, data)
        return h["x-kvrouter-worker"]

    def overlap(self, r, tokens, wid):
        scores = r.json("POST", "/query", {"token_ids": tokens})["scores"]
        return scores.get(str(wid), {}).get("0", 0) // BS

    def test_second_request_follows_the_events(self):
        for legacy in (False, True):
            with self.subTest(legacy=legacy):
                r = self.router()
                ws, chosen = [], set()
                for i in range(3):
                    zmq = "tcp://127.0.0.1:%d" % kvrh.free_port()
                    args = ["--zmq", zmq] + (["--legacy-events"] if legacy else [])
                    w = self.worker(*args)
                    self.register(r, i + 1, w, zmq)
                    ws.append(w)
                for k in range(5):
                    p = prompt(1000 * (k + 1), 4)
                    first = self.complete(r, p)
                    wid = int(first.split(":")[0])
                    chosen.add(wid)
                    kvrh.wait_until(lambda: self.overlap(r, p, wid) == 4, what="events indexed")
                    # The route API shows the overlap it decides on; the proxy follows it.
                    route = r.json("POST", "/v1/route", {"model": "default", "token_ids": p})
                    self.assertEqual((route["worker_id"], route["overlap_blocks"]), (wid, 4))
                    r.json("DELETE", "/v1/route/%s" % route["request_id"])
                    self.assertEqual(self.complete(r, p), first)
                dialect = "A" if legacy else "B"
                # every worker that served a request published in that dialect, and only that one
                self.assertEqual(r.metric("kvrouter_kv_source_dialect_seen", dialect=dialect),
                                 len(chosen))
                other = "B" if legacy else "A"
                self.assertEqual(r.metric("kvrouter_kv_source_dialect_seen", dialect=other), 0)
                self.assertGreaterEqual(r.metric("kvrouter_kv_source_events_total",
                                                 kind="stored"), 5)
                self.assertGreaterEqual(r.metric("kvrouter_kv_source_batches_total"), 5)
                for p_ in list(self.procs):
                    p_.stop()
                self.procs = []

    def test_restarted_worker_clears_and_rebuilds(self):
        r = self.router()
        http_port, zmq = kvrh.free_port(), "tcp://127.0.0.1:%d" % kvrh.free_port()
        w = self.worker("--zmq", zmq, port=http_port)
        self.register(r, 7, w, zmq)
        a, b = prompt(5000, 6), prompt(9000, 3)
        self.complete(r, a)
        kvrh.wait_until(lambda: self.overlap(r, a, 7) == 6, what="first life indexed")
        seq_before = r.metric("kvrouter_kv_source_last_seq", worker_id="7")
        self.assertIsNotNone(seq_before)
        # Kill it hard and start it again on the same endpoints: an empty cache, sequence 0.
        w.p.kill()
        w.p.wait()
        self.procs.remove(w)
        w2 = self.worker("--zmq", zmq, port=http_port)
        kvrh.wait_until(lambda: "kvr_mock_zmq_subscriptions_total 1" in
                        w2.request("GET", "/metrics")[2].decode(), what="re-subscription")
        # The old blocks are still indexed until the new publisher says something.
        self.assertEqual(self.overlap(r, a, 7), 6)
        self.complete(r, b)
        kvrh.wait_until(lambda: self.overlap(r, b, 7) == 3, what="second life indexed")
        self.assertEqual(self.overlap(r, a, 7), 0)  # cleared at the restart
        self.assertEqual(r.metric("kvrouter_kv_source_restarts_total", worker_id="7"), 1)
        # The worker, asked again for a, really has nothing cached: the index agrees with it.
        st, _, data = r.request("POST", "/v1/completions", {"prompt": a, "max_tokens": 1})
        self.assertEqual(st, 200)
        kvrh.wait_until(lambda: self.overlap(r, a, 7) == 6, what="rebuilt")

    def test_dropped_batch_is_replayed(self):
        r = self.router()
        zmq = "tcp://127.0.0.1:%d" % kvrh.free_port()
        replay = "tcp://127.0.0.1:%d" % kvrh.free_port()
        # Batch 1 (the second request's store) is lost on the live socket.
        w = self.worker("--zmq", zmq, "--replay", replay, "--drop-seq", "1")
        self.register(r, 3, w, zmq, replay)
        p0, p1, p2 = prompt(100, 2), prompt(300, 5), prompt(700, 3)
        for p in (p0, p1, p2):
            self.complete(r, p)
        kvrh.wait_until(lambda: self.overlap(r, p2, 3) == 3, what="batch 2 applied")
        kvrh.wait_until(lambda: self.overlap(r, p1, 3) == 5, what="batch 1 recovered by replay")
        self.assertEqual(self.overlap(r, p0, 3), 2)
        self.assertEqual(r.metric("kvrouter_kv_source_gaps_total", worker_id="3"), 1)
        self.assertEqual(r.metric("kvrouter_kv_source_replay_requests_total", worker_id="3"), 1)
        # the replay returns every buffered batch from 1 on; batch 2 may come from it first
        self.assertGreaterEqual(r.metric("kvrouter_kv_source_replayed_batches_total",
                                         worker_id="3"), 1)
        self.assertEqual(r.metric("kvrouter_kv_source_lost_batches_total", worker_id="3"), 0)
        self.assertIn("kvr_mock_batches_dropped_total 1", w.request("GET", "/metrics")[2].decode())

    def test_topic_filter(self):
        # The model's topic filter: a worker publishing under "kv@w1" is heard, one publishing
        # under "other" is not (its batches never reach the SUB socket).
        r = self.router("--model", "default,topic=kv@")
        zmq1, zmq2 = ("tcp://127.0.0.1:%d" % kvrh.free_port() for _ in range(2))
        w1 = self.worker("--zmq", zmq1, "--topic", "kv@w1")
        w2 = self.worker("--zmq", zmq2, "--topic", "other")
        self.register(r, 1, w1, zmq1)
        self.register(r, 2, w2, zmq2)
        p1, p2 = prompt(100, 3), prompt(900, 3)
        self.assertEqual(w1.request("POST", "/v1/completions", {"prompt": p1, "max_tokens": 1})[0],
                         200)
        self.assertEqual(w2.request("POST", "/v1/completions", {"prompt": p2, "max_tokens": 1})[0],
                         200)
        kvrh.wait_until(lambda: self.overlap(r, p1, 1) == 3, what="w1's events")
        time.sleep(0.3)
        self.assertEqual(self.overlap(r, p2, 2), 0)
        self.assertIsNone(r.metric("kvrouter_kv_source_last_seq", worker_id="2"))

    def test_dropped_batch_without_replay_is_counted(self):
        r = self.router()
        zmq = "tcp://127.0.0.1:%d" % kvrh.free_port()
        w = self.worker("--zmq", zmq, "--drop-seq", "1")
        self.register(r, 4, w, zmq)
        p0, p1, p2 = prompt(100, 2), prompt(300, 5), prompt(700, 3)
        for p in (p0, p1, p2):
            self.complete(r, p)
        kvrh.wait_until(lambda: self.overlap(r, p2, 4) == 3, what="batch 2 applied")
        self.assertEqual(r.metric("kvrouter_kv_source_gaps_total", worker_id="4"), 1)
        kvrh.wait_until(lambda: r.metric("kvrouter_kv_source_lost_batches_total",
                                         worker_id="4") == 1, what="loss counted")
        self.assertEqual(self.overlap(r, p1, 4), 0)  # never received: an undercount, not a lie


if __name__ == "__main__":
    unittest.main(verbosity=2)
