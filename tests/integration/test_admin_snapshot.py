"""Admin routes (bearer token; the loopback rule and every protected route: test_security.py),
snapshots (on demand, periodic, on SIGTERM; restart -> identical /dump and query answers; corrupt,
truncated or wrong-version files refused, kept as FILE.refused.<ms>, the router starts empty; a
router SIGKILLed while writing leaves the previous file or a complete new one, never a partial
one; stale temp files are deleted at start), graceful shutdown (in-flight streams finish, no new
connections)."""
import json
import re
import os
import signal
import socket
import struct
import subprocess
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


def xxh3_64(data):
    """XXH3-64 (seed 0), the snapshot trailer (python3-xxhash; Debian's interpreter has it when
    the one running the tests does not)."""
    try:
        import xxhash
        return xxhash.xxh3_64_intdigest(data)
    except ImportError:
        out = subprocess.run(["/usr/bin/python3", "-c", "import sys, xxhash; print(xxhash."
                              "xxh3_64_intdigest(sys.stdin.buffer.read()))"],
                             input=data, capture_output=True, check=True)
        return int(out.stdout)


def chains(n_chains, length, base):
    """Stored events: n_chains chains of `length` blocks, hashes from `base` on."""
    evs = []
    for c in range(n_chains):
        h0 = base + c * length
        evs.append({"worker_id": 1 + c % 4, "event": {"event_id": 1, "data": {"stored": {
            "parent_hash": None, "blocks": [{"block_hash": h0 + k, "tokens_hash": h0 + k}
                                            for k in range(length)]}}}})
    return evs


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

    def test_without_token_loopback_is_served(self):
        r = kvrh.Router()
        try:
            self.assertEqual(r.get("/admin/status")[0], 200)  # from 127.0.0.1
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
        # each refused file was kept aside (so the SIGTERM snapshot could not replace it)
        self.assertFalse(os.path.exists(self.path))
        kept = sorted(f for f in os.listdir(self.dir) if ".refused." in f)
        self.assertEqual(len(kept), 3, kept)
        kept_data = set()
        for f in kept:
            with open(os.path.join(self.dir, f), "rb") as fh:
                kept_data.add(fh.read())
        self.assertIn(b"hello", kept_data)
        # a missing file is fine: start empty
        r3 = kvrh.Router("--snapshot", self.path)
        self.assertIn("starting empty", r3.stderr())
        self.assertEqual(r3.stop(), 0)
        self.assertTrue(os.path.exists(self.path))

    def test_wrong_version_is_refused_and_kept(self):
        r = kvrh.Router("--block-size", "4", "--snapshot", self.path)
        self.fill(r)
        self.assertEqual(r.stop(), 0)
        with open(self.path, "rb") as f:
            good = f.read()
        self.assertEqual(good[:8], b"KVRSNAP1")
        self.assertEqual(struct.unpack_from("<I", good, 8)[0], 1)
        body = good[:8] + struct.pack("<I", 2) + good[12:-8]
        bad = body + struct.pack("<Q", xxh3_64(body))  # a valid checksum: only the version is off
        with open(self.path, "wb") as f:
            f.write(bad)
        r2 = kvrh.Router("--block-size", "4", "--snapshot", self.path)
        try:
            r2.wait_line(r"snapshot .* refused", stream="err")
            self.assertIn("version", r2.stderr())
            m = r2.wait_line(r"the refused file is kept as (\S+)", stream="err")
            kept = m.group(1)
            self.assertTrue(kept.startswith(self.path + ".refused."), kept)
            with open(kept, "rb") as f:
                self.assertEqual(f.read(), bad)
            self.assertFalse(os.path.exists(self.path))
            self.assertEqual(r2.json("GET", "/dump")["default:default"]["events"], [])
        finally:
            self.assertEqual(r2.stop(), 0, r2.stderr())  # writes a fresh snapshot...
        with open(kept, "rb") as f:  # ...and the evidence survives it
            self.assertEqual(f.read(), bad)
        self.assertTrue(os.path.exists(self.path))

    def test_stale_temp_files_are_deleted_at_start(self):
        dead = self.path + ".tmp.%d" % self.dead_pid()
        live = self.path + ".tmp.%d" % os.getpid()  # this process is alive: not touched
        other = os.path.join(self.dir, "other.snap.tmp.1")
        for p in (dead, live, other):
            with open(p, "wb") as f:
                f.write(b"partial")
        r = kvrh.Router("--snapshot", self.path)
        try:
            self.assertIn("deleted " + dead, r.stderr())
            self.assertFalse(os.path.exists(dead))
            self.assertTrue(os.path.exists(live))
            self.assertTrue(os.path.exists(other))
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())

    @staticmethod
    def dead_pid():
        p = subprocess.Popen(["true"])
        p.wait()
        return p.pid  # reaped: no such process (until reused, which takes a pid wrap)

    def test_kill_during_write_keeps_a_complete_snapshot(self):
        # a large index, so that writing takes a while (fewer blocks when runs are slowed down)
        n_chains = int(400 / kvrh.TIME_SCALE) or 1
        r = kvrh.Router("--snapshot", self.path, "--threads", "1", "--max-body", "64M")
        base = 1 << 40
        for part in range(4):
            r.json("POST", "/v1/events", chains(n_chains // 4 or 1, 500, base))
            base += 500 * (n_chains // 4 or 1)
        snap = r.json("POST", "/admin/snapshot")
        write_ms = max(snap["ms"], 5)
        with open(self.path, "rb") as f:
            prev = f.read()
        outcomes = []
        try:
            for i in range(10):
                r.json("POST", "/v1/events", chains(2, 100, base))  # the next one differs
                base += 200
                delay = (i / 9.0) * 1.5 * write_ms / 1000.0
                th = threading.Thread(target=lambda: self.swallow(r.post, "/admin/snapshot"))
                th.start()
                time.sleep(delay)
                r.stop(signal.SIGKILL)
                th.join(kvrh.scaled(30))
                temps = [f for f in os.listdir(self.dir) if ".tmp." in f]
                with open(self.path, "rb") as f:
                    now = f.read()
                outcome = "old" if now == prev else "new"
                # either way it must restore completely, and the temp file must go away
                r = kvrh.Router("--snapshot", self.path, "--threads", "1", "--max-body", "64M")
                self.assertNotIn("refused", r.stderr())
                r.wait_line(r"restored %s" % re.escape(self.path), stream="err")
                self.assertFalse([f for f in os.listdir(self.dir) if ".tmp." in f])
                if outcome == "new":
                    self.assertGreater(len(now), 32)
                    self.assertEqual(now[:8], b"KVRSNAP1")
                outcomes.append((round(delay * 1000, 1), outcome, len(temps)))
                prev = now
        finally:
            r.stop(signal.SIGKILL)
        print("kill during write (delay ms, file, temp files left): %s; one write: %d ms"
              % (outcomes, write_ms), file=sys.stderr)
        self.assertEqual(len(outcomes), 10)

    @staticmethod
    def swallow(fn, *a):
        try:
            fn(*a)
        except (OSError, http_exceptions()):
            pass

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
            self.assertEqual(r.p.wait(kvrh.scaled(20)), 0)
            self.assertTrue(os.path.exists(path))
            r.wait_line(r"\] stopped", stream="err")
        finally:
            r.stop()
            w.stop()


def http_exceptions():
    import http.client
    return http.client.HTTPException


if __name__ == "__main__":
    unittest.main(verbosity=2)
