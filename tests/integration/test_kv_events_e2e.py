#!/usr/bin/python3
"""End to end: kvrouter + mock workers over real ZMQ KV-event streams (issue 6).

- a prompt sent twice is routed to the same worker the second time, with overlap > 0, because the
  worker's events reached the index (both msgpack dialects: map and legacy arrays);
- a worker killed and restarted on the same endpoints: the router sees the publisher restart
  (sequence back to 0), clears that worker's rank, and rebuilds it from the new events; also when
  the new process publishes before the router's SUB is back (through a relay that refuses the
  reconnection meanwhile): with a replay endpoint the reconnect probe clears the rank and
  replays the new life from 0; without one the first batch after the reconnect is not the next
  in sequence, so the rank is cleared and the unseen batches are counted lost;
- a dropped batch (never published live) is detected as a gap and fetched over the replay socket,
  so the index ends up exactly as if nothing had been lost; without a replay endpoint the loss is
  counted instead;
- per-worker subscriber metrics (batches, events by kind, gaps, replays, last sequence, dialect,
  decode errors by dialect, events by storage tier);
- per-worker settings: a ZMQ topic (POST /v1/workers, /register, --worker) falling back to the
  model's, a registered LoRA salting the re-hashing of events that name none, and dp_size > 1
  with TCP port offsets (each rank indexed on its own).
"""
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 16


def prompt(base, blocks):
    return [base + i for i in range(blocks * BS)]


def free_port_pair():
    """A port P with P + 1 free too (dp rank 1's offset endpoint). SO_REUSEADDR as libzmq binds:
    a port whose last connection sits in TIME_WAIT is still usable."""
    for _ in range(200):
        p = kvrh.free_port()
        if p >= 65535:
            continue
        socks = [socket.socket(), socket.socket()]
        try:
            for k, x in enumerate(socks):
                x.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                x.bind(("127.0.0.1", p + k))
            return p
        except OSError:
            continue
        finally:
            for x in socks:
                x.close()
    raise AssertionError("no two consecutive free ports")


class TcpRelay:
    """127.0.0.1:port -> 127.0.0.1:target, a TCP forwarder that can refuse new connections and cut
    the ones it carries: the router's SUB reaches a worker only through it, so a test decides when
    the SUB gets back."""

    def __init__(self, target):
        self.target = target
        self.port = kvrh.free_port()
        self.lock = threading.Lock()
        self.conns = []
        self.ls = None
        self.open()

    def open(self):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(8)
        self.ls = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls):
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        """Stops listening (reconnects are refused) and closes every connection carried."""
        try:
            self.ls.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
        except OSError:
            pass
        self.ls.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for x in conns:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def stop(self):
        self.cut()


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

    def register(self, r, wid, w, zmq, replay=None, **extra):
        body = {"instance_id": wid, "url": w.url, "endpoint": zmq, "block_size": BS}
        if replay:
            body["replay_endpoint"] = replay
        body.update(extra)
        r.json("POST", "/register", body, expect=201)
        self.wait_subscribed(w)

    @staticmethod
    def wait_subscribed(w, n=1):
        # Wait until the SUB socket is attached (the mock counts subscriptions).
        kvrh.wait_until(lambda: "kvr_mock_zmq_subscriptions_total %d" % n in
                        w.request("GET", "/metrics")[2].decode(), what="subscription")

    @staticmethod
    def direct(w, tokens):
        """A completion sent to the worker itself (its events still reach the router)."""
        st, _, data = w.request("POST", "/v1/completions", {"prompt": tokens, "max_tokens": 1})
        assert st == 200, data

    def complete(self, r, tokens):
        st, h, data = r.request("POST", "/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(st, 200, data)
        return h["x-kvrouter-worker"]

    def overlap(self, r, tokens, wid, rank=0, **extra):
        body = {"token_ids": tokens}
        body.update(extra)
        scores = r.json("POST", "/query", body)["scores"]
        return scores.get(str(wid), {}).get(str(rank), 0) // BS

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
        w.stop()  # reaps it and closes its pipes
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

    def restart_behind_reconnect(self, with_replay):
        """The bug: a worker restarted while the router's SUB was away (libzmq's reconnect backoff
        grows to 5 s) publishes its first batches before the SUB is back. They never arrive, the
        sequence never goes back, and the old life's blocks stayed indexed."""
        r = self.router()
        http_port, zport = kvrh.free_port(), kvrh.free_port()
        zmq = "tcp://127.0.0.1:%d" % zport
        replay = "tcp://127.0.0.1:%d" % kvrh.free_port() if with_replay else None
        args = ["--zmq", zmq] + (["--replay", replay] if with_replay else [])
        w = self.worker(*args, port=http_port)
        relay = TcpRelay(zport)
        self.procs.append(relay)
        self.register(r, 7, w, "tcp://127.0.0.1:%d" % relay.port, replay)
        a, b = prompt(5000, 6), prompt(9000, 3)
        self.complete(r, a)  # seq 0
        self.complete(r, b)  # seq 1
        kvrh.wait_until(lambda: self.overlap(r, a, 7) == 6 and self.overlap(r, b, 7) == 3,
                        what="first life indexed")
        relay.cut()  # the SUB loses its connection and cannot come back yet
        w.p.kill()
        w.stop()  # reaps it and closes its pipes
        self.procs.remove(w)
        w2 = self.worker(*args, port=http_port)
        fresh = [prompt(20000 + 1000 * k, 2) for k in range(6)]
        for p in fresh:  # seq 0..5 of the new process, published with nobody subscribed
            self.direct(w2, p)
        m = w2.request("GET", "/metrics")[2].decode()
        self.assertIn("kvr_mock_kv_batches_published_total 6", m)
        self.assertIn("kvr_mock_zmq_subscriptions_total 0", m)  # published before the SUB is back
        relay.open()
        self.wait_subscribed(w2)
        if with_replay:
            # the reconnect probe: another batch 1 -> restart: clear, replay the new life from 0
            kvrh.wait_until(lambda: all(self.overlap(r, p, 7) == 2 for p in fresh),
                            what="new life replayed")
            self.assertEqual(self.overlap(r, a, 7), 0)
            self.assertEqual(self.overlap(r, b, 7), 0)
            self.assertEqual(r.metric("kvrouter_kv_source_restart_probes_total", worker_id="7"), 1)
            self.assertEqual(r.metric("kvrouter_kv_source_lost_batches_total", worker_id="7"), 0)
            self.assertIn("kvr_mock_replay_requests_total 2",
                          w2.request("GET", "/metrics")[2].decode())
        else:
            late = prompt(40000, 4)
            self.direct(w2, late)  # seq 6: not the 2 that would continue the old stream
            kvrh.wait_until(lambda: self.overlap(r, late, 7) == 4, what="seq 6 applied")
            self.assertEqual(self.overlap(r, a, 7), 0)  # the old life is gone...
            self.assertEqual(self.overlap(r, b, 7), 0)
            for p in fresh:  # ...and what could not be seen is counted, not invented
                self.assertEqual(self.overlap(r, p, 7), 0)
            self.assertEqual(r.metric("kvrouter_kv_source_lost_batches_total", worker_id="7"), 6)
        self.assertEqual(r.metric("kvrouter_kv_source_restarts_total", worker_id="7"), 1)
        self.assertGreaterEqual(r.metric("kvrouter_kv_source_disconnects_total", worker_id="7"), 1)

    def test_restart_published_before_resubscription_replayed(self):
        self.restart_behind_reconnect(True)

    def test_restart_published_before_resubscription_counted(self):
        self.restart_behind_reconnect(False)

    def test_register_lora_name(self):
        # Events without a lora_name (SGLang, older vLLM, this mock) are hashed with the LoRA the
        # worker registered, so queries for that LoRA match them, and plain queries do not.
        r = self.router()
        zmq1, zmq2 = ("tcp://127.0.0.1:%d" % kvrh.free_port() for _ in range(2))
        w1 = self.worker("--zmq", zmq1)
        w2 = self.worker("--zmq", zmq2)
        self.register(r, 1, w1, zmq1, lora_name="adapter-a")
        self.register(r, 2, w2, zmq2)
        p = prompt(100, 3)
        self.direct(w1, p)
        self.direct(w2, p)
        kvrh.wait_until(lambda: self.overlap(r, p, 1, lora_name="adapter-a") == 3,
                        what="w1's events under adapter-a")
        kvrh.wait_until(lambda: self.overlap(r, p, 2) == 3, what="w2's plain events")
        self.assertEqual(self.overlap(r, p, 1), 0)
        self.assertEqual(self.overlap(r, p, 2, lora_name="adapter-a"), 0)
        self.assertEqual(self.overlap(r, p, 1, lora_name="adapter-b"), 0)
        # a request naming the LoRA is routed to the worker that has its blocks
        route = r.json("POST", "/v1/route", {"model": "default", "token_ids": p,
                                             "lora_name": "adapter-a"})
        self.assertEqual((route["worker_id"], route["overlap_blocks"]), (1, 3))
        r.json("DELETE", "/v1/route/%s" % route["request_id"])

    def test_worker_topic(self):
        # Each worker's topic filter: its own (POST /v1/workers, /register, --worker) or, when
        # it has none, the model's ("kv@").
        z = ["tcp://127.0.0.1:%d" % kvrh.free_port() for _ in range(4)]
        w1 = self.worker("--zmq", z[0], "--topic", "alpha")
        w2 = self.worker("--zmq", z[1], "--topic", "kv@w2")
        w3 = self.worker("--zmq", z[2], "--topic", "kv@w3")
        w4 = self.worker("--zmq", z[3], "--topic", "gamma")  # bound before the router connects
        r = self.router("--model", "default,topic=kv@", "--worker", "id=4,zmq=%s,topic=gamma" % z[3])
        r.json("POST", "/v1/workers", {"id": 1, "url": w1.url, "zmq": z[0], "topic": "alpha"},
               expect=201)
        self.wait_subscribed(w1)
        self.register(r, 2, w2, z[1])  # no topic: the model's kv@ matches kv@w2
        self.register(r, 3, w3, z[2], topic="beta")  # its own topic beta: kv@w3 is filtered out
        self.wait_subscribed(w4)
        ps = [prompt(1000 * (k + 1), 2) for k in range(4)]
        for w, p in zip((w1, w2, w3, w4), ps):
            self.direct(w, p)
        for wid in (1, 2, 4):
            kvrh.wait_until(lambda: self.overlap(r, ps[wid - 1], wid) == 2,
                            what="worker %d's events" % wid)
        time.sleep(0.3)
        self.assertEqual(self.overlap(r, ps[2], 3), 0)
        self.assertIsNone(r.metric("kvrouter_kv_source_last_seq", worker_id="3"))
        # an explicit empty topic means every message, whatever the model's
        z5 = "tcp://127.0.0.1:%d" % kvrh.free_port()
        w5 = self.worker("--zmq", z5, "--topic", "zzz")
        self.register(r, 5, w5, z5, topic="")
        p5 = prompt(7000, 2)
        self.direct(w5, p5)
        kvrh.wait_until(lambda: self.overlap(r, p5, 5) == 2, what="worker 5's events")
        # wrong types are refused, nothing registered
        for body in ({"instance_id": 9, "endpoint": z5, "topic": 5},
                     {"instance_id": 9, "endpoint": z5, "lora_name": ["a"]}):
            st, _, data = r.request("POST", "/register", body)
            self.assertEqual(st, 400, data)
        st, _, data = r.request("POST", "/v1/workers", {"id": 9, "zmq": z5, "topic": {}})
        self.assertEqual(st, 400, data)
        self.assertEqual(r.request("GET", "/v1/workers/9")[0], 404)

    def test_dp_ranks_with_port_offsets(self):
        # One worker with dp_size 2: rank k's KV events come from rank 0's port + k. Rank 0's
        # publisher says data_parallel_rank 0; rank 1's says nil, so the registered rank applies.
        base = free_port_pair()
        w0 = self.worker("--zmq", "tcp://127.0.0.1:%d" % base, "--dp-rank", "0")
        w1 = self.worker("--zmq", "tcp://127.0.0.1:%d" % (base + 1), "--no-dp-rank")
        r = self.router()
        out = r.json("POST", "/v1/workers", {"id": 5, "url": w0.url,
                                             "zmq": "tcp://127.0.0.1:%d" % base, "dp_size": 2},
                     expect=201)
        ranks = {x["dp_rank"]: x["zmq"] for x in out["worker"]["ranks"]}
        self.assertEqual(ranks, {0: "tcp://127.0.0.1:%d" % base, 1: "tcp://127.0.0.1:%d" % (base + 1)})
        self.wait_subscribed(w0)
        self.wait_subscribed(w1)
        p0, p1 = prompt(100, 3), prompt(500, 2)
        self.direct(w0, p0)
        self.direct(w1, p1)
        kvrh.wait_until(lambda: self.overlap(r, p0, 5, rank=0) == 3, what="rank 0 indexed")
        kvrh.wait_until(lambda: self.overlap(r, p1, 5, rank=1) == 2, what="rank 1 indexed")
        self.assertEqual(self.overlap(r, p0, 5, rank=1), 0)
        self.assertEqual(self.overlap(r, p1, 5, rank=0), 0)
        scores = r.json("POST", "/query", {"token_ids": p1})["scores"]
        self.assertEqual(scores, {"5": {"1": 2 * BS}})
        for rank in (0, 1):
            self.assertEqual(r.metric("kvrouter_kv_source_last_seq", worker_id="5",
                                      dp_rank=str(rank)), 0)
            self.assertEqual(r.metric("kvrouter_kv_source_batches_total", worker_id="5",
                                      dp_rank=str(rank)), 1)

    def test_decode_errors_by_dialect_and_tiers(self):
        # Decode errors are exported per dialect and converted events per storage tier.
        r = self.router()
        zmq1, zmq2 = ("tcp://127.0.0.1:%d" % kvrh.free_port() for _ in range(2))
        w1 = self.worker("--zmq", zmq1, "--corrupt-seq", "1")
        w2 = self.worker("--zmq", zmq2, "--legacy-events", "--corrupt-seq", "0", "--medium", "CPU")
        self.register(r, 1, w1, zmq1)
        self.register(r, 2, w2, zmq2)
        pa, pb, pc = prompt(100, 2), prompt(300, 2), prompt(500, 2)
        for p in (pa, pb, pc):
            self.direct(w1, p)
            self.direct(w2, p)
        kvrh.wait_until(lambda: r.metric("kvrouter_kv_source_batches_total", worker_id="1") == 2
                        and r.metric("kvrouter_kv_source_batches_total", worker_id="2") == 2,
                        what="both streams handled")
        fam = "kvrouter_kv_source_decode_errors_by_dialect_total"
        self.assertEqual(r.metric(fam, worker_id="1", dialect="B"), 1)
        self.assertEqual(r.metric(fam, worker_id="1"), 1)
        self.assertEqual(r.metric(fam, worker_id="2", dialect="A"), 1)
        self.assertEqual(r.metric(fam, worker_id="2"), 1)
        self.assertEqual(r.metric("kvrouter_kv_source_decode_errors_total", worker_id="2"), 1)
        self.assertEqual(r.metric("kvrouter_kv_source_decode_errors_by_kind_total",
                                  worker_id="1", kind="truncated"), 1)
        tier = "kvrouter_kv_source_tier_events_total"
        self.assertEqual(r.metric(tier, worker_id="1", tier="device"), 2)  # batch 1 was corrupt
        self.assertEqual(r.metric(tier, worker_id="1", tier="host_pinned"), 0)
        self.assertEqual(r.metric(tier, worker_id="2", tier="host_pinned"), 2)
        self.assertEqual(r.metric(tier, worker_id="2", tier="device"), 0)
        self.assertEqual(r.metric(tier, worker_id="2", tier="disk"), 0)
        self.assertEqual(r.metric(tier, worker_id="2", tier="external"), 0)
        # the stream went on past the bad batch; host blocks stay out of the device index
        self.assertEqual(self.overlap(r, pa, 1), 2)
        self.assertEqual(self.overlap(r, pb, 1), 0)
        self.assertEqual(self.overlap(r, pc, 1), 2)
        self.assertEqual(self.overlap(r, pc, 2), 0)
        self.assertIn("kvr_mock_batches_corrupted_total 1", w2.request("GET", "/metrics")[2].decode())


if __name__ == "__main__":
    unittest.main(verbosity=2)
