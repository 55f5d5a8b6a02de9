"""kvrh.py - integration-test harness for kvrouter (Python 3 standard library only).

Starts the real binaries on 127.0.0.1 with ephemeral ports (kvrouter --listen 127.0.0.1:0 and
kvr-mock-worker --port 0 print the ports they got), talks HTTP with http.client, and cleans up
every process it started (by its Popen handle, never by name).

Environment: KVR_BIN_DIR (the build's bin/ directory), set by CTest; KVR_WRAP, a command prefix
for kvrouter (e.g. "valgrind --error-exitcode=99 ..."; the valgrind flavour sets it); and
KVR_TIME_SCALE, a factor for every wait and timeout here (and for tests' own latency bounds,
through scaled()), for slow runs under valgrind or sanitizers; KVR_ROUTER_ARGS, options given to
every kvrouter before the test's own (which win), e.g. a longer --policy-budget under valgrind.
"""
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time

BIN = os.environ.get("KVR_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
ROUTER = os.path.join(BIN, "kvrouter")
MOCK = os.path.join(BIN, "kvr-mock-worker")
WRAP = shlex.split(os.environ.get("KVR_WRAP", ""))
ROUTER_ARGS = shlex.split(os.environ.get("KVR_ROUTER_ARGS", ""))
TIME_SCALE = float(os.environ.get("KVR_TIME_SCALE", "1") or 1)
WAIT_S = 15.0  # scaled by wait_until


def scaled(seconds):
    """A time bound for this run: seconds x KVR_TIME_SCALE."""
    return seconds * TIME_SCALE


def wait_until(fn, timeout=WAIT_S, every=0.02, what="condition"):
    """Polls fn() until it returns a true value (for up to scaled(timeout) seconds); returns it,
    or raises AssertionError."""
    end = time.time() + scaled(timeout)
    last = None
    while time.time() < end:
        try:
            last = fn()
            if last:
                return last
        except (OSError, http.client.HTTPException) as e:
            last = e
        time.sleep(every)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


class Proc:
    """A child process whose stdout/stderr are collected by threads."""

    def __init__(self, argv, env=None):
        self.argv = argv
        self.out = []
        self.err = []
        self.lock = threading.Lock()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env, start_new_session=True)
        self._t1 = threading.Thread(target=self._pump, args=(self.p.stdout, self.out), daemon=True)
        self._t2 = threading.Thread(target=self._pump, args=(self.p.stderr, self.err), daemon=True)
        self._t1.start()
        self._t2.start()

    def _pump(self, f, sink):
        for line in iter(f.readline, b""):
            with self.lock:
                sink.append(line.decode("utf-8", "replace"))

    def stdout(self):
        with self.lock:
            return "".join(self.out)

    def stderr(self):
        with self.lock:
            return "".join(self.err)

    def wait_line(self, pattern, stream="out", timeout=WAIT_S):
        rx = re.compile(pattern)

        def find():
            text = self.stdout() if stream == "out" else self.stderr()
            m = rx.search(text)
            if m:
                return m
            if self.p.poll() is not None:
                # it exited: what it wrote last may still be in the pipes
                self._t1.join(2)
                self._t2.join(2)
                m = rx.search(self.stdout() if stream == "out" else self.stderr())
                if m:
                    return m
                raise AssertionError("%s exited with %s before printing %r\nstdout:\n%s\nstderr:\n%s"
                                     % (self.argv[0], self.p.returncode, pattern,
                                        self.stdout(), self.stderr()))
            return None

        return wait_until(find, timeout, what="%r from %s" % (pattern, os.path.basename(self.argv[0])))

    def send(self, sig):
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(scaled(timeout))
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._t1.join(2)
        self._t2.join(2)
        for f in (self.p.stdout, self.p.stderr):
            f.close()
        return self.p.returncode


class Router(Proc):
    """kvrouter on 127.0.0.1:<ephemeral> (or the host of `listen`), run under KVR_WRAP.

    token: starts it with --admin-token TOKEN and sends "Authorization: Bearer TOKEN" with every
    request (request(..., auth=False) leaves it out; an explicit Authorization header wins)."""

    def __init__(self, *args, listen="127.0.0.1:0", env=None, token=None):
        argv = WRAP + [ROUTER, "--listen", listen] + ROUTER_ARGS + [str(a) for a in args]
        if token is not None:
            argv += ["--admin-token", token]
        self.token = token
        super().__init__(argv, env=env)
        m = self.wait_line(r"listening on http://[^\s]+:(\d+)")
        self.port = int(m.group(1))
        host = listen.rsplit(":", 1)[0].strip("[]")
        self.host = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host
        wait_until(lambda: self.get("/healthz")[0] == 200, what="kvrouter /healthz")

    def conn(self, timeout=30):
        return http.client.HTTPConnection(self.host, self.port, timeout=scaled(timeout))

    def request(self, method, path, body=None, headers=None, timeout=30, auth=True):
        """Returns (status, headers dict (lower-case), body bytes)."""
        c = self.conn(timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            hdrs = {"Content-Type": "application/json"}
            if auth and self.token is not None:
                hdrs["Authorization"] = "Bearer " + self.token
            hdrs.update(headers or {})
            c.request(method, path, body=body, headers=hdrs)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body if body is not None else b"", **kw)

    def json(self, method, path, body=None, expect=200, **kw):
        st, _, data = self.request(method, path, body, **kw)
        assert st == expect, "%s %s: expected %d, got %d: %s" % (method, path, expect, st, data[:500])
        return json.loads(data) if data else None

    def metrics(self):
        st, _, data = self.get("/metrics")
        assert st == 200
        return data.decode()

    def metric(self, family, **labels):
        """Sum of the samples of `family` whose labels include `labels`."""
        name = family
        total = 0.0
        found = False
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$", line)
            if not m or m.group(1) != name:
                continue
            lab = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if all(lab.get(k) == str(v) for k, v in labels.items()):
                total += float(m.group(3))
                found = True
        return total if found else None


class MockWorker(Proc):
    """kvr-mock-worker on an ephemeral HTTP port, optionally with ZMQ KV events."""

    def __init__(self, *args, zmq=True, port=0, block_size=16):
        argv = [MOCK, "--port", str(port), "--block-size", str(block_size)]
        if zmq:
            argv += ["--zmq", "tcp://127.0.0.1:*"]
        argv += [str(a) for a in args]
        super().__init__(argv)
        self.wait_line(r"kvr-mock-worker: ready")
        out = self.stdout()
        self.url = re.search(r"http (http://[0-9.]+:\d+)", out).group(1)
        self.port = int(self.url.rsplit(":", 1)[1])
        m = re.search(r"zmq (tcp://[0-9.]+:\d+)", out)
        self.zmq = m.group(1) if m else None

    def request(self, method, path, body=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def raw_http(port, data, read_timeout=5.0, host="127.0.0.1"):
    """Sends raw bytes, returns everything read until close or timeout."""
    s = socket.create_connection((host, port), timeout=scaled(read_timeout))
    try:
        s.sendall(data)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        s.close()


def tmpdir():
    return tempfile.mkdtemp(prefix="kvr-test-")


class FakeWorker:
    """A scriptable HTTP worker in this process (for byte-exact and failure tests).

    behave(path, body) -> action, set by the test:
      ("json", status, bytes)            a Content-Length response
      ("sse", [bytes, ...], delay_s)     chunked text/event-stream, one HTTP chunk per item,
                                         `delay_s` between chunks
      ("cut", [bytes, ...], delay_s)     like sse, then the connection is closed mid-stream
      ("drop",)                          close the connection without answering
    Requests are recorded in self.seen as (path, headers dict, body bytes).
    """

    def __init__(self, behave=None):
        import http.server

        outer = self
        self.seen = []
        self.conns = set()
        self.lock = threading.Lock()
        self.behave = behave or (lambda path, body: ("json", 200, b'{"ok":true}'))

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                with outer.lock:
                    outer.conns.add(self.connection)

            def finish(self):
                with outer.lock:
                    outer.conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def do_GET(self):
                self._serve(b"")

            def do_POST(self):
                self._serve(self._body())

            def _serve(self, body):
                with outer.lock:
                    outer.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                       body))
                act = outer.behave(self.path, body)
                try:
                    if act[0] == "json":
                        self.send_response(act[1])
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(act[2])))
                        self.end_headers()
                        self.wfile.write(act[2])
                    elif act[0] in ("sse", "cut"):
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for i, c in enumerate(act[1]):
                            if i > 0 and act[2]:
                                time.sleep(act[2])
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                            self.wfile.flush()
                        if act[0] == "cut":
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self.wfile.write(b"0\r\n\r\n")
                    elif act[0] == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, path=None):
        with self.lock:
            return sum(1 for s in self.seen if path is None or s[0] == path)

    def stop(self):
        """Stops listening and cuts every open connection (a worker going down)."""
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
