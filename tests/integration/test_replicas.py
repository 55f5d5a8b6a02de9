#!/usr/bin/env python3
"""Several kvrouter replicas agreeing through NATS (issue 9, docs/DEPLOYMENT.md).

Everything runs on loopback: the test starts its own nats-server (Debian's), mock workers that
publish KV events over ZMQ, and two or three kvrouter replicas. Each replica subscribes to every
worker (prefix state converges on its own); booked load travels over NATS.

  - booked load is fleet-wide: bookings made round-robin across replicas show up, exactly, in
    every replica's view, also as they are freed; a repeated prompt is routed to the same
    worker whichever replica receives it (2 and 3 replicas);
  - a replica started late with --peers bootstraps workers and the index from a peer and then
    answers /query exactly like the others, and sees the bookings made before it started;
  - NATS killed and restarted mid-run: no request fails, /readyz reports the degraded state,
    and the views converge again once NATS is back;
  - a replica killed with SIGKILL: its bookings disappear from the others after the timeout
    (not before); a replica stopped cleanly is released at once ("bye").
"""
import json
import os
import shutil
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

NATS = shutil.which("nats-server") or "/usr/sbin/nats-server"
TIMEOUT = "2s"  # --replica-timeout in these tests
TIMEOUT_S = 2.0


class NatsServer(kvrh.Proc):
    """nats-server on 127.0.0.1 (a fixed port, so a restart keeps the address)."""

    def __init__(self, port=None, jetstream_dir=None):
        self.port = port or kvrh.free_port()
        argv = [NATS, "-a", "127.0.0.1", "-p", str(self.port)]
        if jetstream_dir:
            argv += ["-js", "-sd", jetstream_dir]
        super().__init__(argv)
        kvrh.wait_until(self._up, what="nats-server on port %d" % self.port)
        self.url = "nats://127.0.0.1:%d" % self.port

    def _up(self):
        if self.p.poll() is not None:
            raise AssertionError("nats-server exited: %s" % self.stderr())
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False


class NatsClient:
    """The few bits of the NATS text protocol the tests need: PUB, and request/reply for the
    JetStream API (no client library in the standard library)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=kvrh.scaled(5))
        self.f = self.s.makefile("rb")
        self.f.readline()  # INFO
        self.s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nPING\r\n')
        self._expect(b"PONG")
        self.sid = 0

    def _expect(self, word):
        while True:
            line = self.f.readline()
            if not line:
                raise AssertionError("NATS closed the connection")
            if line.startswith(b"PING"):
                self.s.sendall(b"PONG\r\n")
                continue
            if line.startswith(b"-ERR"):
                raise AssertionError("NATS: %r" % line)
            if line.startswith(word):
                return line

    def pub(self, subject, payload):
        if not isinstance(payload, bytes):
            payload = json.dumps(payload).encode()
        self.s.sendall(b"PUB %s %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(payload), payload))
        self._expect(b"PONG")  # the server has it

    def request(self, subject, payload):
        self.sid += 1
        inbox = "_INBOX.kvr%d" % self.sid
        self.s.sendall(b"SUB %s %d\r\n" % (inbox.encode(), self.sid))
        data = json.dumps(payload).encode()
        self.s.sendall(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox.encode(),
                                                      len(data), data))
        line = self._expect(b"MSG")
        n = int(line.split()[-1])
        body = self.f.read(n + 2)[:n]
        return json.loads(body)

    def close(self):
        self.s.close()


def stored(worker, event_id, blocks, parent=None):
    return {"worker_id": worker, "event": {"event_id": event_id, "data": {"stored": {
        "parent_hash": parent,
        "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}}}


def tokens(seed, n=64):
    return [(seed * 7919 + i * 104729) % 30000 + 1 for i in range(n)]


class Replicas(unittest.TestCase):
    def setUp(self):
        if not os.access(NATS, os.X_OK):
            self.fail("nats-server is not installed (scripts/setup.sh installs it)")
        self.procs = []
        self.nats = self.track(NatsServer())
        self.workers = [self.track(kvrh.MockWorker("--decode-us", "100")) for _ in range(3)]

    def tearDown(self):
        bad = []
        for p in reversed(self.procs):
            was_running = p.p.poll() is None
            rc = p.stop()
            # a router stopped here shuts down cleanly (under sanitizers: no report)
            if isinstance(p, kvrh.Router) and was_running and (rc != 0 or "Sanitizer" in
                                                                p.stderr()):
                bad.append("router %d exited %s:\n%s" % (p.port, rc, p.stderr()[-3000:]))
        self.assertEqual(bad, [])

    def track(self, p):
        self.procs.append(p)
        return p

    def worker_flags(self):
        flags = []
        for i, w in enumerate(self.workers):
            flags += ["--worker", "id=%d,url=%s,zmq=%s" % (i + 1, w.url, w.zmq)]
        return flags

    def replica(self, rid, *extra, workers=True, nats=None):
        args = ["--nats", nats or self.nats.url, "--replica-id", str(rid),
                "--replica-timeout", TIMEOUT, "--replica-heartbeat", "200ms",
                "--health-interval", "0", "--threads", "2"]
        if workers:
            args += self.worker_flags()
        return self.track(kvrh.Router(*(args + list(extra))))

    def wait_peers(self, routers):
        for r in routers:
            kvrh.wait_until(lambda r=r: r.json("GET", "/readyz")["replicas"]["peers"]
                            == len(routers) - 1, what="replica %d sees its peers" % r.port)

    @staticmethod
    def load(r):
        """{worker_id: active requests} in r's view (model default)."""
        out = {}
        for line in r.metrics().splitlines():
            if line.startswith("kvrouter_load_active_requests{"):
                lab = dict(__import__("re").findall(r'(\w+)="([^"]*)"', line))
                n = int(float(line.rsplit(" ", 1)[1]))
                if n:
                    out[int(lab["worker_id"])] = out.get(int(lab["worker_id"]), 0) + n
        return out

    def wait_load(self, routers, truth, what):
        truth = {k: v for k, v in truth.items() if v}
        for r in routers:
            kvrh.wait_until(lambda r=r: self.load(r) == truth,
                            what="%s on replica port %d (want %r, have %r)"
                            % (what, r.port, truth, self.load(r)))

    def book(self, r, seed):
        a = r.json("POST", "/v1/route", {"token_ids": tokens(seed)})
        return a["request_id"], a["worker_id"]

    # ---- booked load is fleet-wide -------------------------------------------------------------

    def check_fleet(self, n):
        routers = [self.replica(i + 1) for i in range(n)]
        self.wait_peers(routers)
        booked = []  # (router, request id, worker)
        truth = {}
        for i in range(24):
            r = routers[i % n]
            rid, wid = self.book(r, 1000 + i)
            booked.append((r, rid, wid))
            truth[wid] = truth.get(wid, 0) + 1
        self.assertGreater(len(truth), 1, "the policy spread the bookings")
        self.wait_load(routers, truth, "every booking")
        for r, rid, wid in booked[::2]:  # free half, each on the replica that booked it
            self.assertEqual(r.json("DELETE", "/v1/route/%d" % rid)["status"], "ok")
            truth[wid] -= 1
        self.wait_load(routers, truth, "half freed")
        for r, rid, wid in booked[1::2]:
            r.json("DELETE", "/v1/route/%d" % rid)
        self.wait_load(routers, {}, "all freed")
        # Routing quality: a prompt proxied through one replica lands on a worker; its KV events
        # reach every replica; the same prompt then goes to that worker from any replica.
        prompt = tokens(7, 96)
        st, _, body = routers[0].request("POST", "/v1/completions",
                                          {"prompt": prompt, "max_tokens": 2})
        self.assertEqual(st, 200, body)
        first = routers[0].json("POST", "/v1/route", {"token_ids": prompt, "book": False})
        self.assertGreater(first["overlap_blocks"], 0)
        for r in routers[1:]:
            kvrh.wait_until(lambda r=r: r.json("POST", "/v1/route", {
                "token_ids": prompt, "book": False})["overlap_blocks"] == first["overlap_blocks"],
                what="the prompt's blocks reach replica %d" % r.port)
            self.assertEqual(r.json("POST", "/v1/route", {"token_ids": prompt, "book": False})
                             ["worker_id"], first["worker_id"])
        for r in routers:
            self.assertGreater(r.metric("kvrouter_replica_published_bytes_total"), 0)
            self.assertEqual(r.metric("kvrouter_replica_decode_errors_total"), 0)
            self.assertGreater(r.metric("kvrouter_replica_sync_delay_seconds_count"), 0)

    def test_two_replicas_share_booked_load(self):
        self.check_fleet(2)

    def test_three_replicas_share_booked_load(self):
        self.check_fleet(3)

    # ---- a late replica bootstraps from a peer -------------------------------------------------

    def test_late_replica_bootstraps_from_a_peer(self):
        a, b = self.replica(1), self.replica(2)
        self.wait_peers([a, b])
        prompts = [tokens(50 + i, 48 + 16 * i) for i in range(6)]
        for p in prompts[:4]:
            st, _, body = a.request("POST", "/v1/completions", {"prompt": p, "max_tokens": 2})
            self.assertEqual(st, 200, body)
        held = [self.book(b, 900 + i) for i in range(3)]  # booked before the new one exists
        truth = {}
        for _, wid in held:
            truth[wid] = truth.get(wid, 0) + 1

        def query(r, p):
            return r.json("POST", "/query", {"token_ids": p})["scores"]

        kvrh.wait_until(lambda: all(query(a, p) == query(b, p) for p in prompts),
                        what="the two first replicas agree")
        # The new replica knows no worker: it takes them, and the index, from a peer.
        c = self.replica(3, "--peers", "http://127.0.0.1:1,http://127.0.0.1:%d" % a.port,
                         workers=False)
        kvrh.wait_until(lambda: c.get("/readyz")[0] == 200, what="bootstrap done")
        self.assertEqual(sorted(w["id"] for w in c.json("GET", "/v1/workers")["workers"]),
                         [1, 2, 3])
        for p in prompts:
            self.assertEqual(query(c, p), query(a, p))
        self.assertGreater(c.metric("kvrouter_bootstrap_dump_events") or 0, 0)
        self.wait_peers([a, b, c])
        self.wait_load([a, b, c], truth, "bookings made before the late replica started")
        # live events keep flowing into the new replica after the bootstrap
        for p in prompts[4:]:
            a.request("POST", "/v1/completions", {"prompt": p, "max_tokens": 2})
        kvrh.wait_until(lambda: all(query(c, p) == query(a, p) and query(c, p)
                                    for p in prompts[4:]), what="live events after bootstrap")

    # ---- NATS down and back -------------------------------------------------------------------

    def test_nats_restart_no_failed_requests_then_converge(self):
        a, b = self.replica(1), self.replica(2)
        self.wait_peers([a, b])
        truth = {}
        ids = []
        for i in range(6):
            r = (a, b)[i % 2]
            rid, wid = self.book(r, 300 + i)
            ids.append((r, rid, wid))
            truth[wid] = truth.get(wid, 0) + 1
        self.wait_load([a, b], truth, "bookings before the outage")
        port = self.nats.port
        self.nats.stop(__import__("signal").SIGKILL)
        for r in (a, b):
            kvrh.wait_until(lambda r=r: r.json("GET", "/readyz")["replicas"]["nats"]
                            == "disconnected", what="degraded state reported")
            self.assertEqual(r.get("/readyz")[0], 200)  # still ready: routing on the local view
        failures = 0
        for i in range(10):  # requests during the outage: all served
            r = (a, b)[i % 2]
            st, _, _ = r.request("POST", "/v1/route", {"token_ids": tokens(400 + i)})
            failures += st != 200
            st, _, _ = r.request("POST", "/v1/completions",
                                 {"prompt": tokens(450 + i), "max_tokens": 1})
            failures += st != 200
        self.assertEqual(failures, 0)
        # bookings made during the outage, and frees of older ones
        for r, rid, wid in ids[:3]:
            r.json("DELETE", "/v1/route/%d" % rid)
            truth[wid] -= 1
        self.nats = self.track(NatsServer(port=port))
        for r in (a, b):
            kvrh.wait_until(lambda r=r: r.json("GET", "/readyz")["replicas"]["nats"]
                            == "connected", what="reconnected")
        la = kvrh.wait_until(lambda: self.load(a) == self.load(b) and self.load(a),
                             what="views converge after NATS came back (a=%r b=%r)"
                             % (self.load(a), self.load(b)))
        # the converged view is the true one: outage bookings (10) + the 3 still held
        self.assertEqual(sum(la.values()), 10 + 3)
        self.assertGreater(a.metric("kvrouter_replica_nats_reconnects_total"), 0)

    def test_short_nats_outage_converges(self):
        # Shorter than the timeout: nobody is presumed dead; what was published meanwhile is
        # buffered by libnats or repaired by the full-state exchange on reconnection.
        a, b = self.replica(1), self.replica(2)
        self.wait_peers([a, b])
        port = self.nats.port
        self.nats.stop(__import__("signal").SIGKILL)
        for r in (a, b):
            kvrh.wait_until(lambda r=r: r.json("GET", "/readyz")["replicas"]["nats"]
                            == "disconnected", what="degraded state reported")
        truth = {}
        for i in range(8):
            rid, wid = self.book((a, b)[i % 2], 800 + i)
            truth[wid] = truth.get(wid, 0) + 1
        self.nats = self.track(NatsServer(port=port))
        self.wait_load([a, b], truth, "bookings made during a short outage")
        self.assertEqual(a.metric("kvrouter_replica_timeouts_total"), 0)

    # ---- a replica dies -----------------------------------------------------------------------

    def test_dead_replica_released_after_timeout(self):
        a, b, c = self.replica(1), self.replica(2), self.replica(3)
        self.wait_peers([a, b, c])
        truth_a = {}
        for i in range(4):
            _, wid = self.book(a, 600 + i)
            truth_a[wid] = truth_a.get(wid, 0) + 1
        truth_b = {}
        for i in range(3):
            _, wid = self.book(b, 700 + i)
            truth_b[wid] = truth_b.get(wid, 0) + 1
        both = {k: truth_a.get(k, 0) + truth_b.get(k, 0) for k in set(truth_a) | set(truth_b)}
        self.wait_load([a, b, c], both, "bookings of a and b")
        t0 = time.time()
        a.stop(__import__("signal").SIGKILL)  # no goodbye
        time.sleep(TIMEOUT_S * 0.5)
        self.assertEqual(self.load(c), {k: v for k, v in both.items() if v},
                         "released before the timeout")
        self.wait_load([b, c], truth_b, "a's bookings released after the timeout")
        elapsed = time.time() - t0
        self.assertLess(elapsed, kvrh.scaled(TIMEOUT_S + 3))
        self.assertGreater(c.metric("kvrouter_replica_timeouts_total"), 0)
        # a clean stop says goodbye: released on the goodbye, not by the timeout
        b.stop()
        self.wait_load([c], {}, "b's bookings released on its goodbye")
        self.assertEqual(c.metric("kvrouter_replica_byes_total"), 1)
        self.assertEqual(c.metric("kvrouter_replica_timeouts_total"), 1)  # a's only



class NatsEvents(unittest.TestCase):
    """KV events as RouterEvent JSON on NATS subjects, replayed from JetStream (model options
    nats_subject / nats_stream)."""

    def setUp(self):
        self.procs = []
        self.dir = kvrh.tmpdir()
        self.nats = NatsServer(jetstream_dir=self.dir)
        self.procs.append(self.nats)
        self.c = NatsClient(self.nats.port)

    def tearDown(self):
        self.c.close()
        bad = []
        for p in reversed(self.procs):
            was_running = p.p.poll() is None
            rc = p.stop()
            if isinstance(p, kvrh.Router) and was_running and (rc != 0 or "Sanitizer" in
                                                                p.stderr()):
                bad.append("router %d exited %s:\n%s" % (p.port, rc, p.stderr()[-3000:]))
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(bad, [])

    def scores(self, r, model, hashes):
        return r.json("POST", "/query_by_hash", {"block_hashes": hashes, "model_name": model})[
            "scores"]

    def test_jetstream_replay_then_live_and_plain_subject(self):
        a = self.c.request("$JS.API.STREAM.CREATE.KVEV", {
            "name": "KVEV", "subjects": ["kv.events.>"], "storage": "memory"})
        self.assertNotIn("error", a, a)
        # published before any router exists: only the stream has them
        self.c.pub("kv.events.m1", stored(1, 0, [(101, 11), (102, 12)]))
        self.c.pub("kv.events.m1", [stored(2, 1, [(201, 11)]),
                                    stored(1, 2, [(103, 13)], parent=102)])
        r = kvrh.Router("--nats", self.nats.url, "--health-interval", "0",
                        "--model", "m1,nats_subject=kv.events.m1,nats_stream=KVEV",
                        "--model", "m2,nats_subject=kv.plain")
        self.procs.append(r)
        kvrh.wait_until(lambda: self.scores(r, "m1", [11, 12, 13]) ==
                        {"1": {"0": 48}, "2": {"0": 16}}, what="events replayed from the stream")
        # live: a removal, and a message with one good and one bad event
        self.c.pub("kv.events.m1", {"worker_id": 1, "event": {"event_id": 3, "data": {
            "removed": {"block_hashes": [103]}}}})
        self.c.pub("kv.events.m1", [stored(3, 4, [(301, 11)]), {"worker_id": "x"}])
        kvrh.wait_until(lambda: self.scores(r, "m1", [11, 12, 13]) ==
                        {"1": {"0": 32}, "2": {"0": 16}, "3": {"0": 16}}, what="live events")
        self.assertEqual(r.metric("kvrouter_nats_events_bad_messages_total", model="m1:default"),
                         1)
        self.assertEqual(r.metric("kvrouter_nats_events_rejected_total", model="m1:default"), 1)
        # a subject without a stream: live only
        kvrh.wait_until(lambda: r.metric("kvrouter_nats_events_subscribed") == 1,
                        what="subscribed")
        self.c.pub("kv.plain", stored(9, 0, [(901, 21)]))
        kvrh.wait_until(lambda: self.scores(r, "m2", [21]) == {"9": {"0": 16}},
                        what="plain subject")
        # a restarted router replays the stream again: same index, nothing lost
        r.stop()
        r2 = kvrh.Router("--nats", self.nats.url, "--health-interval", "0",
                         "--model", "m1,nats_subject=kv.events.m1,nats_stream=KVEV")
        self.procs.append(r2)
        kvrh.wait_until(lambda: self.scores(r2, "m1", [11, 12, 13]) ==
                        {"1": {"0": 32}, "2": {"0": 16}, "3": {"0": 16}},
                        what="a restart catches up from the stream")

    def test_bad_config(self):
        p = kvrh.Proc([kvrh.ROUTER, "--model", "m,nats_subject=x", "--check-config"])
        self.assertEqual(p.p.wait(30), 2)
        p.stop()  # joins the output readers
        self.assertIn("need --nats", p.stderr() + p.stdout())


if __name__ == "__main__":
    unittest.main(verbosity=2)
