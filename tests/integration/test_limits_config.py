"""HTTP hygiene and configuration: body/header limits (413/400, the server keeps serving),
malformed requests, unknown routes and methods, the connection cap, idle timeouts; --help
documents every option and each is accepted; bad flags and bad Lua config files are clear errors
naming the option or key; the Lua file is sandboxed."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402


def run(*args, timeout=20):
    p = subprocess.run([kvrh.ROUTER] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Limits(unittest.TestCase):
    def test_bodies_headers_and_bad_requests(self):
        r = kvrh.Router("--max-body", "1K", "--max-headers", "2K", "--threads", "1")
        try:
            st, _, _ = r.post("/v1/events", b"[" + b" " * 2048 + b"]")
            self.assertEqual(st, 413)
            self.assertEqual(r.get("/healthz")[0], 200)
            st, _, data = r.post("/query", b'{"token_ids": [1, 2,')
            self.assertEqual(st, 400)
            self.assertIn("invalid JSON", json.loads(data)["error"])
            self.assertEqual(r.post("/query", b"")[0], 400)
            self.assertEqual(r.post("/query", b"[]")[0], 400)
            big = "x" * 4096
            st, _, _ = r.get("/healthz", headers={"X-Big": big})
            self.assertIn(st, (400, 413, 431))
            raw = kvrh.raw_http(r.port, b"GARBAGE\r\n\r\n")
            self.assertTrue(raw.startswith(b"HTTP/1.1 400") or raw == b"", raw[:100])
            st, hdrs, data = r.request("PUT", "/query")
            self.assertEqual(st, 405)
            self.assertIn("POST", hdrs["allow"])
            self.assertIn("error", json.loads(data))
            st, _, data = r.get("/no/such/route")
            self.assertEqual((st, json.loads(data)["error"]), (404, "no route for /no/such/route"))
            self.assertEqual(r.get("/healthz")[0], 200)
            self.assertGreaterEqual(r.metric("kvrouter_http_requests_total", code="400"), 2)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())

    def test_connection_cap_and_idle_timeout(self):
        r = kvrh.Router("--max-connections", "2", "--threads", "1", "--timeout", "1")
        try:
            a = socket.create_connection(("127.0.0.1", r.port))
            b = socket.create_connection(("127.0.0.1", r.port))
            c = socket.create_connection(("127.0.0.1", r.port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            c.settimeout(0.4)
            with self.assertRaises(socket.timeout):  # waits in the backlog
                c.recv(100)
            a.close()
            c.settimeout(5)
            self.assertTrue(c.recv(100).startswith(b"HTTP/1.1 200"))
            # the idle one is closed by the server after --timeout
            b.settimeout(5)
            t0 = time.time()
            self.assertEqual(b.recv(100), b"")
            self.assertLess(time.time() - t0, 3)
            b.close()
            c.close()
            kvrh.wait_until(lambda: r.metric("kvrouter_http_accept_pauses_total") >= 1,
                            what="the pause counted")
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())


def drip(port, head, body=b"", every=0.3, limit=30.0):
    """Sends head then body one byte every `every` seconds until the server answers or closes.
    Returns (seconds from the first byte, seconds from the end of the head or None, what the
    server sent first)."""
    import select
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.time()
    t_head = None
    data = head + body
    got = b""
    try:
        if body:  # the headers in one go, then the body byte by byte
            s.sendall(head)
            t_head = time.time()
            data = body
        k = 0
        while time.time() - t0 < limit:
            if k < len(data):
                try:
                    s.sendall(data[k:k + 1])
                except OSError:
                    break
                k += 1
            rd, _, _ = select.select([s], [], [], every)
            if rd:
                try:
                    got = s.recv(4096)
                except OSError as e:
                    got = repr(e).encode()
                break
        t1 = time.time()
        return t1 - t0, (t1 - t_head) if t_head else None, got
    finally:
        s.close()


class SlowClients(unittest.TestCase):
    def test_slow_clients_are_cut_by_the_read_deadlines(self):
        import threading
        r = kvrh.Router("--header-timeout", "1", "--body-timeout", "1.5", "--timeout", "30",
                        "--threads", "1")
        try:
            stop = threading.Event()
            normal = {"ok": 0, "bad": [], "max": 0.0}

            def serve():  # a normal client, served all along
                while not stop.is_set():
                    t = time.time()
                    try:
                        st = r.get("/healthz", timeout=5)[0]
                    except OSError as e:
                        st = repr(e)
                    normal["max"] = max(normal["max"], time.time() - t)
                    if st == 200:
                        normal["ok"] += 1
                    else:
                        normal["bad"].append(st)
                    time.sleep(0.02)
            th = threading.Thread(target=serve)
            th.start()
            res = {}
            head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
            post = b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            jobs = [("h%d" % k, (head,)) for k in range(4)] + \
                   [("b%d" % k, (post, b"[" * 100)) for k in range(2)]

            def run_one(name, args):
                res[name] = drip(r.port, *args)
            ths = [threading.Thread(target=run_one, args=j) for j in jobs]
            # within the deadlines: headers in three pieces over 0.6 s, then a body in 0.6 s
            def polite():
                s = socket.create_connection(("127.0.0.1", r.port))
                s.settimeout(kvrh.scaled(5))
                for piece in (b"POST /v1/events HTTP/1.1\r\n", b"Host: x\r\nContent-Le",
                              b"ngth: 2\r\n\r\n"):
                    s.sendall(piece)
                    time.sleep(0.3)
                s.sendall(b"[")
                time.sleep(0.6)
                s.sendall(b"]")
                res["polite"] = s.recv(4096)
                # keep-alive: idle for longer than both deadlines, then another request
                time.sleep(2.0)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                res["polite2"] = s.recv(4096)
                s.close()
            ths.append(threading.Thread(target=polite))
            for t in ths:
                t.start()
            for t in ths:
                t.join(kvrh.scaled(40))
            stop.set()
            th.join(10)
            slack = kvrh.scaled(0.8)
            for k in range(4):
                total, _, got = res["h%d" % k]
                self.assertGreaterEqual(total, 1.0 - 0.05, res)
                self.assertLess(total, 1.0 + slack, res)
                self.assertTrue(got.startswith(b"HTTP/1.1 408") or got == b"" or
                                b"Reset" in got, got)
            for k in range(2):
                _, from_head, got = res["b%d" % k]
                self.assertGreaterEqual(from_head, 1.5 - 0.05, res)
                self.assertLess(from_head, 1.5 + slack, res)
            self.assertTrue(any(res[n][2].startswith(b"HTTP/1.1 408") for n in res
                                if n[0] in "hb"), res)
            self.assertTrue(res["polite"].startswith(b"HTTP/1.1 200"), res["polite"])
            self.assertTrue(res["polite2"].startswith(b"HTTP/1.1 200"), res["polite2"])
            self.assertEqual(r.metric("kvrouter_http_slow_clients_total"), 6)
            self.assertEqual(normal["bad"], [])
            self.assertGreater(normal["ok"], 20)
            self.assertLess(normal["max"], kvrh.scaled(0.5), normal)
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())


class Config(unittest.TestCase):
    def test_help_documents_every_option_and_each_is_accepted(self):
        code, out, _ = run("--help")
        self.assertEqual(code, 0)
        opts = re.findall(r"^  (--[a-z-]+)(?: ([A-Z|:]+))?", out, re.M)
        names = [o for o, _ in opts]
        for must in ("--listen", "--threads", "--admin-token", "--max-body", "--max-headers",
                     "--max-connections", "--timeout", "--header-timeout", "--body-timeout",
                     "--open-indexer-api", "--snapshot", "--snapshot-period",
                     "--policy", "--config", "--model", "--worker", "--retries",
                     "--health-interval", "--breaker-failures", "--tokenizer", "--help"):
            self.assertIn(must, names)
        d = kvrh.tmpdir()
        cfg = os.path.join(d, "kvrouter.lua")
        with open(cfg, "w") as f:
            f.write("return { threads = 1 }\n")
        sample = {"HOST:PORT": "127.0.0.1:0", "N": "3", "TOKEN": "a-long-token", "SIZE": "1M",
                  "DUR": "2s", "FILE": os.path.join(d, "x.snap"), "FILE|NAME": "kv",
                  "PATH": "/health", "MODE": "bytes", "LEVEL": "debug",
                  "SPEC": None, "URL": "nats://127.0.0.1:4222", "SUBJECT": "kvr.test"}
        by_name = {"--peers": "http://127.0.0.1:9", "--replica-flush": "5ms"}
        for name, meta in opts:
            if name in ("--help", "--version", "--check-config", "--model", "--worker"):
                continue
            args = [name]
            if name == "--config":
                args.append(cfg)
            elif name in by_name:
                args.append(by_name[name])
            elif meta:
                args.append(sample[meta])
            if name == "--snapshot-period":
                args = ["--snapshot", sample["FILE"]] + args
            with self.subTest(option=name):
                code, out, err = run(*args, "--check-config")
                self.assertEqual(code, 0, "%s: %s" % (args, err))
                self.assertIn("configuration ok", out)
        code, out, err = run("--model", "m,block_size=32,kind=approx,tokenizer=bytes,ttl=30s",
                             "--model", "n:acme,index=both",
                             "--worker", "id=1,model=m,url=http://127.0.0.1:9,dp=2,label.zone=a",
                             "--check-config")
        self.assertEqual((code, out.strip()), (0, "kvrouter: configuration ok (2 model(s), 1 "
                                                  "worker(s))"), err)
        self.assertEqual(run("--version")[0], 0)

    def test_bad_flags_name_the_option(self):
        cases = [(["--threads", "0"], "--threads"), (["--threads", "x"], "--threads"),
                 (["--max-body", "1Q"], "--max-body"), (["--listen", "nowhere"], "--listen"),
                 (["--timeout", "-1"], "--timeout"), (["--bogus"], "--bogus"),
                 (["--model", "m,block_size=1"], "block_size"),
                 (["--model", "m,colour=red"], "colour"),
                 (["--worker", "id=1,url=ftp://x"], "url"),
                 (["--worker", "url=http://x:1"], "id"),
                 (["--worker", "id=1,model=zzz,url=http://x:1"], "zzz"),
                 (["--snapshot-period", "10"], "--snapshot"),
                 (["--admin-token", ""], "--admin-token"),
                 (["--log-level", "loud"], "--log-level"),
                 (["--config", "/nonexistent/kvrouter.lua"], "/nonexistent/kvrouter.lua"),
                 (["extra-arg"], "extra-arg")]
        for args, needle in cases:
            with self.subTest(args=args):
                code, _, err = run(*args, "--check-config")
                self.assertEqual(code, 2, err)
                self.assertIn(needle, err)
                self.assertTrue(err.startswith("kvrouter: "), err)

    def lua(self, text):
        d = kvrh.tmpdir()
        path = os.path.join(d, "kvrouter.lua")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_lua_config_file(self):
        path = self.lua("""
            local n = 0
            for i = 1, 3 do n = n + i end          -- plain Lua works
            return {
              listen = "127.0.0.1:0", threads = n - 4,
              admin_token = env("KVR_TEST_TOKEN") or "fallback-token",
              limits = { max_body = "2M", max_connections = 100, timeout = 5 },
              snapshot = { period = 0 },
              health = { interval = "500ms", fails = 2 },
              models = { { name = "llama", block_size = 32, kind = "events" },
                         { name = "mistral", tenant = "acme", block_size = 16, kind = "approx",
                           tokenizer = "bytes", approx = { ttl = 60, max_blocks = 1000 } } },
              workers = { { id = 7, model = "llama", url = "http://127.0.0.1:9", dp_size = 2,
                            labels = { zone = "a", gpu = "h100" } } },
            }""")
        env = dict(os.environ, KVR_TEST_TOKEN="token-from-env")
        r = kvrh.Router("--config", path, env=env)
        try:
            st = r.json("GET", "/admin/status", headers={"Authorization": "Bearer token-from-env"})
            self.assertEqual(len(st["threads"]), 2)
            self.assertEqual([(m["key"], m["block_size"], m["kind"]) for m in st["models"]],
                             [("llama:default", 32, "events"), ("mistral:acme", 16, "approx")])
            ws = r.json("GET", "/v1/workers")["workers"]
            self.assertEqual(len(ws), 1)
            self.assertEqual(ws[0]["labels"], {"zone": "a", "gpu": "h100"})
            self.assertEqual([x["dp_rank"] for x in ws[0]["ranks"]], [0, 1])
        finally:
            self.assertEqual(r.stop(), 0, r.stderr())
        # flags override the file
        code, out, err = run("--config", path, "--threads", "5", "--check-config")
        self.assertEqual(code, 0, err)

    def test_bad_lua_config_is_a_clear_error(self):
        cases = [("return { limits = { max_bdy = 1 } }", "limits.max_bdy: unknown key"),
                 ("return { threads = 'many' }", "threads"),
                 ("return { models = { { name = 'm', block_size = 1 } } }",
                  "kvrouter.lua: models[1].block_size: expected an integer in 2..65536"),
                 ("return { workers = { { model = 'default', url = 'http://x:1' } } }", "id"),
                 ("return 42", "must return a table"),
                 ("return {", "kvrouter.lua:1:"),
                 ("os.execute('touch /tmp/kvr-pwned') return {}", "os"),
                 ("return { x = io.open('/etc/passwd') }", "io"),
                 ("require('ffi') return {}", "require"),
                 ("while true do end", "instruction budget"),
                 ("local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1e6) end",
                  "instruction budget"),
                 ("return { x = string.rep('x', 2^28) }", "memory"),
                 ("local s = 'x' for i = 1, 40 do s = s .. s end return {}", "memory"),
                 ("return { listen = {} }", "listen")]
        for text, needle in cases:
            with self.subTest(text=text):
                code, _, err = run("--config", self.lua(text), "--check-config", timeout=60)
                self.assertEqual(code, 2, err)
                self.assertIn(needle, err)
        self.assertFalse(os.path.exists("/tmp/kvr-pwned"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
