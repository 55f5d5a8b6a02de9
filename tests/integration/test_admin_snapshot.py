"""Admin routes (bearer token, loopback-only without one), snapshots (on demand, periodic, on
SIGTERM; restart -> identical /dump and query answers; corrupt or truncated files refused, the
router starts empty), graceful shutdown (in-flight streams finish, no new connections)."""
import json
import os
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

L0, L1 = 9143094415614847814, 12124091508212882195


def stored(worker, parent, blocks, rank=0):
    return {"worker_id": worker, "event": {"event_id": 1, "dp_rank": rank, "data": {"stored": {
        "parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}}}


def non_loopback_ip():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


class Admin(unittest.TestCase):
    def test_bearer_token(self):
        r = kvrh.Router("--admin-token", "s3cret-token")
        try:
            st, hdrs, data = r.get("/admin/status")
            self.assertEqual(st, 401)
            self.assertIn("Bearer", hdrs["www-authenticate"])
            self.assertIn("error", json.loads(data))
            self.assertEqual(r.get("/admin/status", headers={"Authorization": "Bearer nope"})[0], 401)
            self.assertEqual(r.post("/admin/snapshot?path=/tmp/x")[0], 401)
            ok = {"Authorization": "Bearer s3cret-token"}
            st, _, data = r.get("/admin/status", headers=ok)
            self.assertEqual(st, 200)
            status = json.loads(data)
            self.assertTrue(status["ready"])
            self.assertEqual(len(status["threads"]), 2)
            self.assertEqual(status["models"][0]["key"], "default:default")
            self.assertEqual(r.get("/admin/nope", headers=ok)[0], 404)
            self.assertEqual(r.post("/admin/status", headers=ok)[0], 405)
            # the policy route: refused with a JSON error (no body, or no runtime / bad source)
            st, _, data = r.post("/admin/policy", b"", headers=ok)
            self.assertEqual(st, 400)
            st, _, data = r.post("/admin/policy?model=nope", b"return {}", headers=ok)
            self.assertEqual(st, 404)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())

    def test_without_token_only_loopback(self):
        ip = non_loopback_ip()
        r = kvrh.Router(listen="0.0.0.0:0")
        try:
            self.assertEqual(r.get("/admin/status")[0], 200)  # from 127.0.0.1
            if ip is None:
                self.skipTest("no non-loopback address on this host")
            import http.client
            c = http.client.HTTPConnection(ip, r.port, timeout=10)
            c.request("GET", "/admin/status")
            resp = c.getresponse()
            self.assertEqual(resp.status, 403)
            self.assertIn(b"loopback", resp.read())
            c.request("GET", "/healthz")  # other routes are open
            resp = c.getresponse()
            self.assertEqual(resp.status, 200)
            resp.read()
            c.close()
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())


class Snapshots(unittest.TestCase):
    def setUp(self):
        self.dir = kvrh.tmpdir()
        self.path = os.path.join(self.dir, "index.snap")

    def fill(self, r):
        r.json("POST", "/register", {"instance_id": 1, "model_name": "llama", "block_size": 4,
                                     "url": "http://127.0.0.1:9"}, expect=201)
        evs = [stored(7, None, [(16045690984503111693, L0), (2, L1)]), stored(8, None, [(3, L0)]),
               stored(7, None, [(5, L0), (6, 77)], rank=3), stored(9, 3, [(10, 55)])]
        self.assertEqual(r.json("POST", "/v1/events?model=llama", evs)["rejected"],
                         [{"index": 3, "error": "ParentBlockNotFound"}])
        r.json("POST", "/v1/events", [stored(7, None, [(1, L0)])])

    def answers(self, r):
        qs = [[L0], [L0, L1], [L0, 77], [L1], [55]]
        return [r.json("POST", "/query_by_hash", {"block_hashes": q, "model_name": m})
                for q in qs for m in ("llama", "default")]

    def test_restart_restores_identical_state(self):
        r = kvrh.Router("--block-size", "4", "--snapshot", self.path)
        try:
            self.fill(r)
            dump, answers = r.json("GET", "/dump"), self.answers(r)
            snap = r.json("POST", "/admin/snapshot")
            self.assertEqual(snap["path"], self.path)
            self.assertEqual(snap["models"], 2)
            self.assertGreater(snap["bytes"], 32)
            r.json("POST", "/v1/events?model=llama", [stored(8, 3, [(4, L1)])])  # after it
            dump, answers = r.json("GET", "/dump"), self.answers(r)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())  # SIGTERM writes the final snapshot
        self.assertIn("wrote " + self.path, r.stderr())
        r2 = kvrh.Router("--block-size", "4", "--snapshot", self.path)
        try:
            self.assertEqual(r2.json("GET", "/dump"), dump)
            self.assertEqual(self.answers(r2), answers)
            self.assertIn("restored", r2.stderr())
            self.assertGreater(r2.json("GET", "/admin/status")["snapshot"]["restored_events"], 0)
        finally:
            self.assertEqual(r2.stop(), 0, r2.stderr())

    def test_corrupt_or_truncated_snapshot_is_refused(self):
        r = kvrh.Router("--block-size", "4", "--snapshot", self.path)
        self.fill(r)
        self.assertEqual(r.stop(), 0)
        with open(self.path, "rb") as f:
            good = f.read()
        for name, data in (("flipped", good[:40] + bytes([good[40] ^ 1]) + good[41:]),
                           ("truncated", good[:len(good) // 2]), ("garbage", b"hello")):
            with self.subTest(name=name):
                with open(self.path, "wb") as f:
                    f.write(data)
                r2 = kvrh.Router("--block-size", "4", "--snapshot", self.path)
                try:
                    r2.wait_line(r"snapshot .* refused", stream="err")
                    self.assertIn("EMPTY", r2.stderr())
                    dump = r2.json("GET", "/dump")
                    self.assertEqual(dump["default:default"]["events"], [])
                    self.assertNotIn("llama:default", dump)
                    # it serves normally
                    r2.json("POST", "/v1/events", [stored(1, None, [(1, L0)])])
                finally:
                    r2.stop(signal.SIGKILL)  # do not overwrite the corrupt file
        # a missing file is fine: start empty
        os.unlink(self.path)
        r3 = kvrh.Router("--snapshot", self.path)
        self.assertIn("starting empty", r3.stderr())
        self.assertEqual(r3.stop(), 0)
        self.assertTrue(os.path.exists(self.path))

    def test_periodic_snapshots(self):
        r = kvrh.Router("--block-size", "4", "--snapshot", self.path, "--snapshot-period", "200ms")
        try:
            r.json("POST", "/v1/events", [stored(1, None, [(1, L0)])])
            kvrh.wait_until(lambda: (r.metric("kvrouter_snapshot_writes_total") or 0) >= 2,
                            what="two periodic snapshots")
            self.assertTrue(os.path.exists(self.path))
            self.assertFalse([f for f in os.listdir(self.dir) if ".tmp." in f])
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())


class Shutdown(unittest.TestCase):
    def test_sigterm_finishes_in_flight_streams(self):
        w = kvrh.MockWorker("--decode-us", "100000", block_size=4, zmq=False)
        d = kvrh.tmpdir()
        path = os.path.join(d, "s.snap")
        r = kvrh.Router("--block-size", "4", "--snapshot", path, "--health-interval", "0")
        try:
            r.json("POST", "/register", {"instance_id": 1, "url": w.url}, expect=201)
            res = {}

            def run():
                res["r"] = r.request("POST", "/v1/completions", {
                    "prompt": list(range(16)), "max_tokens": 12, "stream": True})
            th = threading.Thread(target=run)
            th.start()
            kvrh.wait_until(lambda: r.metric("kvrouter_load_active_requests") == 1,
                            what="stream started")
            t0 = time.time()
            r.send(signal.SIGTERM)
            r.wait_line(r"shutting down", stream="err")
            # no new connections once draining
            def refused():
                try:
                    socket.create_connection(("127.0.0.1", r.port), timeout=1).close()
                    return False
                except OSError:
                    return True
            kvrh.wait_until(refused, what="the listener closed")
            th.join(10)
            st, _, data = res["r"]
            self.assertEqual(st, 200)
            self.assertTrue(data.decode().rstrip().endswith("data: [DONE]"), data[-200:])
            self.assertGreater(time.time() - t0, 0.3)  # it waited for the stream
            self.assertEqual(r.p.wait(20), 0)
            self.assertTrue(os.path.exists(path))
            self.assertIn("stopped", r.stderr())
        finally:
            r.stop()
            w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
