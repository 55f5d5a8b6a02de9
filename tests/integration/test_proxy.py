"""OpenAI-compatible proxy: completions and chat (buffered and SSE), byte-for-byte unbuffered
streaming, the load lifecycle (booked on routing, prefill done at the first chunk, freed at the
end, also when the client leaves or the worker fails), retries before the first byte (connection
refused, 5xx, 429), the circuit breaker opening and closing, cache affinity from KV events."""
import http.client
import json
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import kvrh  # noqa: E402

BS = 4


def stored(worker, tokens_hashes, rank=0):
    blocks = [{"block_hash": 1000 + i, "tokens_hash": t} for i, t in enumerate(tokens_hashes)]
    return {"worker_id": worker, "event": {"event_id": 1, "dp_rank": rank, "data": {"stored": {
        "parent_hash": None, "blocks": blocks}}}}


L0, L1 = 9143094415614847814, 12124091508212882195  # tokens 0..7 at block size 4
PROMPT = list(range(8))  # routed with overlap 2 where the events put L0, L1


def read_chunked(sock, deadline_s=10):
    """Reads an HTTP/1.1 response with a chunked body from a raw socket. Returns (status,
    headers text, [(t, chunk bytes)], complete)."""
    f = sock.makefile("rb")
    status_line = f.readline()
    status = int(status_line.split()[1])
    head = b""
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        head += line
    chunks, complete = [], False
    sock.settimeout(deadline_s)
    try:
        while True:
            size_line = f.readline()
            if not size_line:
                break
            n = int(size_line.strip().split(b";")[0], 16)
            if n == 0:
                f.readline()
                complete = True
                break
            data = f.read(n)
            f.readline()
            chunks.append((time.time(), data))
    except (OSError, ValueError):
        pass
    return status, head.decode(), chunks, complete


class Proxy(unittest.TestCase):
    def router(self, *extra):
        r = kvrh.Router("--block-size", str(BS), "--health-interval", "0", "--retry-backoff", "1ms",
                        *extra)
        self.addCleanup(lambda: self.assertEqual(r.stop(), 0, r.stderr()))
        return r

    def fake(self, behave=None):
        fw = kvrh.FakeWorker(behave)
        self.addCleanup(fw.stop)
        return fw

    def mock(self, *args, **kw):
        w = kvrh.MockWorker(*args, **kw)
        self.addCleanup(w.stop)
        return w

    def test_completions_chat_models_through_the_mock_worker(self):
        w = self.mock(block_size=BS, zmq=False)
        r = self.router()
        r.json("POST", "/register", {"instance_id": 3, "url": w.url}, expect=201)
        body = {"model": "mock-model", "prompt": "Hello there, how are you today?", "max_tokens": 5}
        st, hdrs, data = r.request("POST", "/v1/completions", body)
        self.assertEqual(st, 200, data)
        got = json.loads(data)
        _, _, direct = w.request("POST", "/v1/completions", body)
        want = json.loads(direct)
        for k in ("id", "created"):
            got.pop(k), want.pop(k)
        want["usage"]["prompt_tokens_details"]["cached_tokens"] = got["usage"][
            "prompt_tokens_details"]["cached_tokens"]
        self.assertEqual(got, want)
        self.assertEqual(hdrs["x-kvrouter-worker"], "3:0")
        self.assertTrue(int(hdrs["x-kvrouter-request-id"]) > 0)
        self.assertEqual(hdrs["content-type"], "application/json")
        # chat, streamed: SSE events end with [DONE]
        chat = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "stream": True}
        st, hdrs, data = r.request("POST", "/v1/chat/completions", chat)
        self.assertEqual(st, 200)
        self.assertTrue(hdrs["content-type"].startswith("text/event-stream"))
        events = [l for l in data.decode().split("\n\n") if l]
        self.assertEqual(events[-1], "data: [DONE]")
        self.assertEqual(len(events), 1 + 3 + 1 + 1)  # role, 3 tokens, finish, DONE
        models = r.json("GET", "/v1/models")
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], ["default"])
        self.assertEqual(models["data"][0]["workers"], 1)
        # request errors
        self.assertEqual(r.request("POST", "/v1/completions", b"{oops")[0], 400)
        self.assertEqual(r.request("POST", "/v1/chat/completions", {"model": "x"})[0], 400)
        self.assertEqual(r.request("POST", "/v1/completions", {"prompt": {"a": 1}})[0], 400)
        self.assertEqual(r.metric("kvrouter_load_active_requests", worker_id="3"), 0)

    def test_stream_passes_through_byte_for_byte_without_buffering(self):
        chunks = [b'data: {"a": "\\u00e9\xc3\xa9"}\n\n', b"data: {\"b\"", b": 2}\n\ndata: [DONE]\n",
                  b"\n", b"x" * 70000, b"\r\n\r\n"]
        fw = self.fake(lambda path, body: ("sse", chunks, 0.3))
        r = self.router()
        r.json("POST", "/register", {"instance_id": 1, "url": fw.url}, expect=201)
        s = socket.create_connection(("127.0.0.1", r.port))
        body = json.dumps({"prompt": [1, 2, 3], "stream": True}).encode()
        t0 = time.time()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        status, head, got, complete = read_chunked(s)
        s.close()
        self.assertEqual(status, 200)
        self.assertTrue(complete)
        self.assertEqual(b"".join(c for _, c in got), b"".join(chunks))
        # the first chunk reached the client long before the worker finished (5 x 0.3 s)
        self.assertLess(got[0][0] - t0, 0.25)
        self.assertGreater(got[-1][0] - t0, 1.2)
        self.assertIn("text/event-stream", head)
        # what the worker received: the client's body, unchanged, on its own path
        path, hdrs, seen_body = fw.seen[0]
        self.assertEqual((path, seen_body), ("/v1/completions", body))
        self.assertEqual(hdrs["host"], "127.0.0.1:%d" % fw.port)

    def test_slow_client_pauses_the_worker_stream(self):
        chunks = [bytes([65 + i % 26]) * (256 * 1024) for i in range(40)]  # 10 MiB at once
        fw = self.fake(lambda path, body: ("sse", chunks, 0))
        r = self.router()
        r.json("POST", "/register", {"instance_id": 1, "url": fw.url}, expect=201)
        s = socket.create_connection(("127.0.0.1", r.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        body = b'{"prompt": [1, 2, 3], "stream": true}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        time.sleep(1.0)  # the worker has written everything; the client has read nothing
        self.assertGreaterEqual(r.metric("kvrouter_proxy_backpressure_pauses_total"), 1)
        status, _, got, complete = read_chunked(s, deadline_s=30)
        s.close()
        self.assertEqual(status, 200)
        self.assertTrue(complete)
        self.assertEqual(b"".join(c for _, c in got), b"".join(chunks))
        self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)

    def test_load_lifecycle_and_client_disconnect(self):
        w = self.mock("--decode-us", "150000", "--prefill-us", "0", block_size=BS, zmq=False)
        r = self.router()
        r.json("POST", "/register", {"instance_id": 9, "url": w.url}, expect=201)
        load = lambda: r.metric("kvrouter_load_active_requests", worker_id="9")  # noqa: E731
        prefill = lambda: r.metric("kvrouter_load_prefill_tokens", worker_id="9")  # noqa: E731
        # a complete stream: booked while it runs, prefill done after the first chunk, freed at end
        done = {}

        def run():
            done["r"] = r.request("POST", "/v1/completions", {"prompt": list(range(40)),
                                                              "max_tokens": 8, "stream": True})
        th = threading.Thread(target=run)
        th.start()
        kvrh.wait_until(lambda: load() == 1, what="the booking")
        kvrh.wait_until(lambda: prefill() == 0, what="prefill done at the first chunk")
        th.join(10)
        self.assertEqual(done["r"][0], 200)
        self.assertEqual(load(), 0)
        # a client that leaves mid-stream: the worker request is cancelled, the load freed
        s = socket.create_connection(("127.0.0.1", r.port))
        body = json.dumps({"prompt": list(range(40)), "max_tokens": 40, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        f = s.makefile("rb")
        self.assertIn(b"200", f.readline())
        kvrh.wait_until(lambda: load() == 1, what="the second booking")
        s.shutdown(socket.SHUT_RDWR)
        s.close()
        kvrh.wait_until(lambda: load() == 0, what="load freed after the client left")
        kvrh.wait_until(lambda: r.metric("kvrouter_proxy_client_disconnects_total") == 1,
                        what="disconnect counted")
        self.assertEqual(r.metric("kvrouter_worker_in_flight", worker_id="9"), 0)
        kvrh.wait_until(lambda: r.metric("kvrouter_http_requests_total", code="499") == 1,
                        what="499 recorded")

    def test_retry_when_the_preferred_worker_is_down(self):
        good = self.fake()
        r = self.router()
        dead = "http://127.0.0.1:%d" % kvrh.free_port()
        r.json("POST", "/register", {"instance_id": 1, "url": dead}, expect=201)
        r.json("POST", "/register", {"instance_id": 2, "url": good.url}, expect=201)
        r.json("POST", "/v1/events", [stored(1, [L0, L1])])  # the dead one has the prefix
        for _ in range(3):
            st, hdrs, data = r.request("POST", "/v1/completions", {"prompt": PROMPT})
            self.assertEqual(st, 200, data)
            self.assertEqual(hdrs["x-kvrouter-worker"], "2:0")
        self.assertGreaterEqual(r.metric("kvrouter_proxy_retries_total"), 3)
        self.assertGreaterEqual(r.metric("kvrouter_proxy_upstream_errors_total", kind="connect"), 3)
        self.assertEqual(good.count("/v1/completions"), 3)
        self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)

    def test_retry_on_5xx_and_429_before_the_first_byte(self):
        for status in (503, 429, 500):
            with self.subTest(status=status):
                bad = self.fake(lambda p, b, s=status: ("json", s, b'{"error":"busy"}'))
                good = self.fake()
                r = self.router()
                r.json("POST", "/register", {"instance_id": 1, "url": bad.url}, expect=201)
                r.json("POST", "/register", {"instance_id": 2, "url": good.url}, expect=201)
                r.json("POST", "/v1/events", [stored(1, [L0, L1])])
                st, hdrs, data = r.request("POST", "/v1/completions", {"prompt": PROMPT})
                self.assertEqual(st, 200, data)
                self.assertEqual(json.loads(data), {"ok": True})
                self.assertEqual((bad.count(), good.count()), (1, 1))
                kind = "status_429" if status == 429 else "status_5xx"
                self.assertEqual(r.metric("kvrouter_proxy_upstream_errors_total", kind=kind), 1)
                # 429 is not a breaker failure (the worker is alive, shedding load)
                self.assertEqual(r.metric("kvrouter_worker_requests_failed_total", worker_id="1"),
                                 0 if status == 429 else 1)

    def test_retry_backoff_doubles_up_to_its_cap(self):
        # four workers; the first three attempts (whichever worker gets them) answer 503, the
        # fourth 200. With --retry-backoff 200ms and --retry-backoff-max 400ms the attempts
        # start 200 ms, 400 ms and 400 ms (capped, not 800) after the previous one, +-20% jitter
        times, lock = [], threading.Lock()

        def behave(path, body):
            with lock:
                times.append(time.monotonic())
                n = len(times)
            return ("json", 503, b'{"error":"busy"}') if n <= 3 else ("json", 200, b'{"ok":1}')

        fakes = [self.fake(behave) for _ in range(4)]
        r = self.router("--retry-backoff", "200ms", "--retry-backoff-max", "400ms",
                        "--retries", "3")
        for i, fw in enumerate(fakes):
            r.json("POST", "/register", {"instance_id": i + 1, "url": fw.url}, expect=201)
        st, hdrs, data = r.request("POST", "/v1/completions", {"prompt": PROMPT})
        self.assertEqual((st, data), (200, b'{"ok":1}'))
        self.assertEqual(len(times), 4)
        self.assertEqual(sorted(fw.count() for fw in fakes), [1, 1, 1, 1])  # 4 workers, 4 tries
        gaps = [b - a for a, b in zip(times, times[1:])]
        slack = 0.15  # scheduling on a busy machine; timers never fire early
        for gap, nominal in zip(gaps, (0.2, 0.4, 0.4)):
            self.assertGreaterEqual(gap, nominal * 0.8, gaps)
            self.assertLess(gap, nominal * 1.2 + slack, gaps)
        self.assertEqual(r.metric("kvrouter_proxy_retries_total"), 3)
        self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)

    def test_last_attempt_passes_the_error_through(self):
        bad = self.fake(lambda p, b: ("json", 500, b'{"error":{"message":"boom"}}'))
        r = self.router()
        r.json("POST", "/register", {"instance_id": 1, "url": bad.url}, expect=201)
        st, _, data = r.request("POST", "/v1/completions", {"prompt": PROMPT})
        self.assertEqual((st, data), (500, b'{"error":{"message":"boom"}}'))
        # nothing registered at all
        r2 = self.router()
        st, _, data = r2.request("POST", "/v1/completions", {"prompt": PROMPT})
        self.assertEqual(st, 503)
        self.assertIn(b"no worker", data)

    def test_breaker_opens_and_closes(self):
        state = {"fail": True}
        flaky = self.fake(lambda p, b: ("json", 503, b"{}") if state["fail"] else
                          ("json", 200, b'{"ok":"flaky"}'))
        good = self.fake()
        r = self.router("--breaker-failures", "2", "--breaker-open", "400ms",
                        "--breaker-successes", "2")
        r.json("POST", "/register", {"instance_id": 1, "url": flaky.url}, expect=201)
        r.json("POST", "/register", {"instance_id": 2, "url": good.url}, expect=201)
        r.json("POST", "/v1/events", [stored(1, [L0, L1])])
        brk = lambda: r.metric("kvrouter_worker_breaker_state", worker_id="1")  # noqa: E731
        for _ in range(2):
            self.assertEqual(r.request("POST", "/v1/completions", {"prompt": PROMPT})[0], 200)
        self.assertEqual(brk(), 2)  # open
        self.assertEqual(r.metric("kvrouter_worker_breaker_opens_total", worker_id="1"), 1)
        n = flaky.count()
        for _ in range(5):  # while open, the flaky worker gets nothing
            st, hdrs, _ = r.request("POST", "/v1/completions", {"prompt": PROMPT})
            self.assertEqual((st, hdrs["x-kvrouter-worker"]), (200, "2:0"))
        self.assertEqual(flaky.count(), n)
        state["fail"] = False
        time.sleep(0.45)
        self.assertEqual(brk(), 1)  # half-open: probes allowed
        for _ in range(2):
            st, hdrs, _ = r.request("POST", "/v1/completions", {"prompt": PROMPT})
            self.assertEqual((st, hdrs["x-kvrouter-worker"]), (200, "1:0"))
        self.assertEqual(brk(), 0)  # closed again

    def test_worker_failing_mid_stream_cuts_the_client(self):
        chunks = [b"data: 1\n\n", b"data: 2\n\n"]
        fw = self.fake(lambda p, b: ("cut", chunks, 0.05))
        r = self.router()
        r.json("POST", "/register", {"instance_id": 1, "url": fw.url}, expect=201)
        s = socket.create_connection(("127.0.0.1", r.port))
        body = b'{"prompt": [1, 2], "stream": true}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(body), body))
        status, _, got, complete = read_chunked(s)
        s.close()
        self.assertEqual(status, 200)
        self.assertFalse(complete)  # no terminating chunk: the client sees the failure
        self.assertEqual(b"".join(c for _, c in got), b"".join(chunks))
        kvrh.wait_until(lambda: r.metric("kvrouter_proxy_upstream_errors_total", kind="midstream")
                        == 1, what="midstream error counted")
        self.assertEqual(r.metric("kvrouter_load_active_requests"), 0)
        self.assertEqual(r.get("/healthz")[0], 200)

    def test_cache_affinity_from_kv_events(self):
        ws = [self.mock(block_size=BS) for _ in range(2)]
        r = self.router()
        for i, w in enumerate(ws):
            r.json("POST", "/register", {"instance_id": i + 1, "url": w.url, "endpoint": w.zmq},
                   expect=201)
        time.sleep(0.3)  # let the SUB sockets attach
        for k in range(4):
            prompt = list(range(500 * (k + 1), 500 * (k + 1) + 40))
            st, h1, _ = r.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
            self.assertEqual(st, 200)
            first = h1["x-kvrouter-worker"]
            kvrh.wait_until(lambda: r.json("POST", "/query", {"token_ids": prompt})["scores"],
                            what="KV events of the first request")
            for _ in range(3):  # the same prompt goes back to the worker that has it cached
                st, h2, data = r.request("POST", "/v1/completions",
                                         {"prompt": prompt, "max_tokens": 1})
                self.assertEqual((st, h2["x-kvrouter-worker"]), (200, first))
                self.assertEqual(json.loads(data)["usage"]["prompt_tokens_details"]["cached_tokens"],
                                 40)


if __name__ == "__main__":
    unittest.main(verbosity=2)
