#!/usr/bin/env python3
"""seeds.py - writes the generated seed files of fuzz/corpus/ (run from anywhere; idempotent).

The engine targets' original seeds (spec examples, engine-written snapshots, CKF frames) are
committed as they are; this script adds:
  event_msgpack/  dialect C (an outer map) and a mixed batch (every event form and trap in one)
  event_json/     the /dump shape (an object of models) and a /dump event list
  http_json/      one body per check of fuzz_http_json.c (first byte = the check)
  http_body/      one body per endpoint of fuzz_http_body.c (first byte = the endpoint)
  config/         Lua config files: the documented example, every group, and refusals
Python 3 standard library only (a tiny msgpack writer below)."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ==== msgpack (the subset the engines use) =====================================================

class F32(float):
    """A float to encode as float32 (ca)."""


class Bin(bytes):
    """bytes to encode as bin (c4)."""


def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 0x80:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v <= 0xff:
            return b"\xcc" + bytes([v])
        if 0 <= v <= 0xffff:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v <= 0xffffffff:
            return b"\xce" + struct.pack(">I", v)
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        if v >= -128:
            return b"\xd0" + struct.pack(">b", v)
        if v >= -(1 << 31):
            return b"\xd2" + struct.pack(">i", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, F32):
        return b"\xca" + struct.pack(">f", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, Bin):
        return b"\xc4" + bytes([len(v)]) + bytes(v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, (list, tuple)):
        n = len(v)
        return (bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)) + \
            b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        n = len(v)
        return (bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)) + \
            b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


def stored_map(hashes, parent, bs=4, **extra):
    e = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
         "token_ids": list(range(1, 1 + bs * len(hashes))), "block_size": bs, "lora_id": None,
         "medium": "GPU", "lora_name": None}
    e.update(extra)
    return e


def msgpack_seeds():
    # dialect C: the outer batch is a map
    put("event_msgpack", "dialect_c_outer_map.msgpack", mp({
        "ts": 1717171717.25,
        "events": [stored_map([101, 102], None),
                   stored_map([103], 102, extra_keys=[None], group_idx=0,
                              kv_cache_spec_kind="full_attention"),
                   {"type": "BlockRemoved", "block_hashes": [103], "medium": "GPU"},
                   {"type": "AllBlocksCleared"}],
        "data_parallel_rank": 1}))
    # a mixed batch: positional (era A) and map (era B) events together, every hash form
    # (uint, negative int, 32-byte digest), float32 ts, the two positional traps (index 7 a
    # SGLang metadata map, index 9 Dynamo's mm infos), an unknown tag, a host-tier medium,
    # a REMOTE locality (dropped), EAGLE bigram token ids
    digest = Bin(bytes(range(32)))
    put("event_msgpack", "mixed_batch.msgpack", mp([
        F32(12.5),
        [["BlockStored", [201, -2], None, list(range(8)), 4, None, "GPU", None],
         ["BlockStored", [digest], 201, list(range(4)), 4, None, "CPU", {"cache_salt": "ns1"},
          [None], [{"mm_objects": [{"mm_hash": 77, "offsets": [[0, 2]]}]}]],
         {"type": "BlockStored", "block_hashes": [(1 << 64) - 1], "parent_block_hash": -2,
          "token_ids": [[1, 2], [3, 4], [5, 6], [7, 8]], "block_size": 4, "lora_id": 3,
          "medium": "STORAGE", "lora_name": "adapter-a"},
         {"type": "BlockStored", "block_hashes": [301], "parent_block_hash": None,
          "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": None,
          "lora_name": None, "locality": "REMOTE"},
         ["SomethingNew", 1, 2, 3],
         {"type": "BlockRemoved", "block_hashes": [201, digest], "medium": "GPU",
          "unknown_key": [1, {"x": None}]},
         ["BlockRemoved", [-2], None],
         ["AllBlocksCleared"],
         {"type": "AllBlocksCleared"}],
        0]))


# ==== RouterEvent JSON in the /dump shapes =====================================================

def router_events():
    return [
        {"worker_id": 7, "event": {"event_id": 1, "dp_rank": 0, "data": {"stored": {
            "parent_hash": None, "blocks": [
                {"block_hash": 16045690984503111693, "tokens_hash": 9143094415614847814},
                {"block_hash": 2, "tokens_hash": 12124091508212882195}]}}}},
        {"worker_id": 7, "event": {"event_id": 2, "dp_rank": 3, "data": {"stored": {
            "parent_hash": 2, "blocks": [{"block_hash": 5, "tokens_hash": 77}]}}}},
        {"worker_id": 8, "event": {"event_id": 3, "dp_rank": 0, "data": {"stored": {
            "parent_hash": None, "blocks": [{"block_hash": 3, "tokens_hash": 1}]}}}},
    ]


def event_json_seeds():
    evs = router_events()
    put("event_json", "dump_events.json", json.dumps(evs))
    put("event_json", "dump_object.json", json.dumps({
        "default:default": {"block_size": 16, "events": evs},
        "llama:acme": {"block_size": 4, "events": evs[:1]}}))


# ==== request bodies ===========================================================================

HTTP_JSON = [  # (check, body)
    (0, {"block_hashes": [1, 2, 18446744073709551615, -1], "model_name": "default"}),
    (0, {"model_name": "m", "tenant_id": "t", "block_hashes": []}),
    (0, '{ "block_hashes" : [ 9223372036854775808 , -9223372036854775808 ] }'),
    (1, {"model": "default", "token_ids": [1, 2, 3], "session_id": "s", "book": False,
         "overlap_weight": 1.5, "headers": {"x-a": "b"}, "n": None, "t": True}),
    (1, '{"a":{"b":[{"c":"\\u00e9\\n"}]},"d":-0.5e-3,"e":[]}'),
    (2, "[1, 2, 3, -4, 18446744073709551615]"),
    (2, "[]"),
    (3, "[0, 4294967295, 7]"),
    (3, "[1.0, 2]"),
]

ENDPOINT_BODIES = [  # (endpoint index in fuzz_http_body.c, body)
    (0, {"block_hashes": [101, 102, 103], "model_name": "default"}),
    (1, {"token_ids": list(range(12)), "model_name": "default", "tenant_id": "default"}),
    (2, {"model": "default", "token_ids": list(range(16)), "session_id": "s1",
         "scores": True}),
    (2, {"model": "approx", "text": "hello world, hello router", "book": False}),
    (2, {"model": "default", "block_hashes": [101, 102], "isl": 8,
         "messages": [{"role": "user", "content": "hi"}]}),
    (3, {"model": "default", "prompt": list(range(8)), "max_tokens": 4, "stream": True}),
    (3, {"model": "approx", "prompt": "tell me a story", "max_tokens": 2}),
    (4, {"model": "default", "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "hi"}],
         "stream": False}),
    (5, router_events()),
    (5, "\n".join(json.dumps(e) for e in router_events())),
    (6, [{"worker_id": 2, "event": {"event_id": 1, "data": {"cleared": {}}}}]),
    (6, [{"worker_id": 2, "event": {"event_id": 1, "data": {"cleared": None}}}]),
    (7, {"instance_id": 9, "model_name": "m2", "block_size": 8, "dp_rank": 1}),
    (7, {"instance_id": 9, "model_name": "m2", "block_size": 8, "dp_rank": 1,
         "url": "http://127.0.0.1:1", "lora_name": "a"}),
    (8, {"instance_id": 9, "model_name": "m2"}),
    (8, {"instance_id": 9, "model_name": "m2", "dp_rank": 1}),
    (9, {"id": 3, "model": "default", "dp_size": 2, "labels": {"zone": "a"}}),
    (9, {"id": 3, "model": "default", "dp_size": 2, "labels": {"zone": "a"},
         "url": "http://127.0.0.1:1"}),
    (10, {"id": 3, "model": "default"}),
]


def http_seeds():
    for k, (check, body) in enumerate(HTTP_JSON):
        text = body if isinstance(body, str) else json.dumps(body)
        put("http_json", "check%d_%02d.bin" % (check, k), bytes([check]) + text.encode())
    for k, (ep, body) in enumerate(ENDPOINT_BODIES):
        text = body if isinstance(body, str) else json.dumps(body)
        put("http_body", "ep%02d_%02d.bin" % (ep, k), bytes([ep]) + text.encode())


# ==== config files =============================================================================

CONFIGS = {
    "documented.lua": """return {
  listen = "0.0.0.0:8080", threads = 4, admin_token = env("KVROUTER_ADMIN_TOKEN"),
  limits = { max_body = "16M", max_connections = 8192, timeout = 60, header_timeout = "5s",
             body_timeout = 30 },
  snapshot = { path = "/var/lib/kvrouter/index.snap", period = 300 },
  models = { { name = "llama", block_size = 16, kind = "events", policy = "kv" },
             { name = "mistral", tenant = "acme", block_size = 32, kind = "approx",
               tokenizer = "bytes", approx = { ttl = 120, max_blocks = 1048576,
               prune_ratio = 0.8 } } },
  workers = { { id = 1, model = "llama", url = "http://10.0.0.5:8000",
                zmq = "tcp://10.0.0.5:5557", dp_size = 2, labels = { zone = "a" } } },
}
""",
    "groups.lua": """local base = 1000
local t = { health = { interval = "500ms", timeout = 1, path = "/health", fails = 2,
                       passes = 1 },
            breaker = { failures = 3, successes = 1, open = "2s" },
            retry = { max = 1, backoff = "10ms", backoff_max = "100ms" },
            log_level = "warn", seed = base * 7, tokenizer = "none",
            open_indexer_api = true, allow_policy_header = false }
for i = 1, 3 do t["block_size"] = 8 * i end
return t
""",
    "refused_key.lua": "return { limits = { max_bdy = 1 } }",
    "refused_escape.lua": "local f = io.open('/etc/passwd') return {}",
    "refused_pattern.lua": "return { listen = ('x'):rep(10):gsub('x', 'y') }",
    "refused_loop.lua": "local n = 0 while true do n = n + 1 end",
    "refused_pcall_loop.lua": "while true do pcall(function() while true do end end) end",
    "refused_memory.lua": "local s = 'x' for i = 1, 40 do s = s .. s end return {}",
    "refused_syntax.lua": "return {",
    "refused_type.lua": "return { threads = {}, models = 'x' }",
}


def config_seeds():
    for name, text in CONFIGS.items():
        put("config", name, text)


if __name__ == "__main__":
    msgpack_seeds()
    event_json_seeds()
    http_seeds()
    config_seeds()
