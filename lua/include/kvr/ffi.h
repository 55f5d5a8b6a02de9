/* ffi.h - the flat ABI between C and the LuaJIT policy runtime (structs + the kvr_ffi_* calls).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. Everything a policy sees crosses this boundary as plain C structs that LuaJIT's FFI
 * reads directly (no Lua C API per field, no copies):
 *
 *   server / simulator                      Lua state (one per thread)
 *   ──────────────────                      ─────────────────────────────────────────────
 *   struct kvr_ffi_request   ─┐             kvr.policy glue (trusted, JIT-compiled):
 *   struct kvr_ffi_candidate[]├─ pointers ─▶  reads the structs through FFI cdata,
 *   (kvr_ffi_call.ranked out)─┘  in the      fills reusable Lua tables req / candidates,
 *                                kvr_ffi_call calls the policy's select(req, candidates)
 *                                            (sandboxed, JIT off, time and memory budgets),
 *                                            writes the chosen indices to call->ranked
 *   kvr_ffi_* functions  ◀─── pull-style calls through struct kvr_ffi_api (function pointers)
 *
 * The block between KVR_FFI_CDEF_BEGIN and KVR_FFI_CDEF_END is macro-free C that the build copies
 * verbatim into the Lua library (ffi.cdef): it is the single source of every shared layout. A test
 * (tests/unit/lua/test_ffi.c) compares ffi.sizeof/ffi.offsetof with C sizeof/offsetof for every
 * struct and field, so the two can never drift. Fields are ordered for natural alignment with
 * explicit padding; no bitfields, no packed structs.
 *
 * Why a table of function pointers rather than ffi.C symbol lookup: kvr_lua is a static library
 * linked into the server, the tests, the benchmark and the simulator. ffi.C only resolves symbols
 * exported from the executable's dynamic symbol table, which needs -Wl,-E / ENABLE_EXPORTS on
 * EVERY executable, and the linker also drops archive members nobody references from C (so
 * ffi.c would vanish from a test binary). Handing the state one `const struct kvr_ffi_api *`
 * (a lightuserdata at state creation) works with any link, carries an ABI version and size check,
 * and costs nothing measurable: JIT-compiled calls through a function-pointer field are one
 * indirect call. The kvr_ffi_* functions are still ordinary exported functions (declared below),
 * so ffi.C can reach them too in an executable built with ENABLE_EXPORTS.
 *
 * Conventions (style.md §4): kvr_ffi_* return KVR_OK or a negative KVR_E* code; an error text is
 * returned through `const char **err` (a static string); results go to caller-provided cdata
 * scratch arrays (count-then-fill: KVR_ERANGE with *n_out = the count needed). No engine pointer
 * ever crosses into Lua: Lua holds only the opaque kvr_ffi_vm_t and passes it back. Every call
 * that touches the engine fails with KVR_ETIMEDOUT once the current decision's deadline has
 * passed (a JIT-compiled loop that calls the engine is stopped there; see lua.h, time budget).
 * Strings are (pointer, length), not NUL-terminated; a NULL pointer means absent.
 * Thread-safety: every kvr_ffi_* call is made by the thread that owns the VM; engine calls take
 * the engine's own locks (index read lock, load tracker mutex) inside the call only.
 */
#ifndef KVR_FFI_H
#define KVR_FFI_H

#include <stddef.h>
#include <stdint.h>

#define KVR_FFI_ABI 2u         /* bump on any layout change of the block below */
#define KVR_FFI_RANKED_MAX 256 /* entries of kvr_ffi_call.ranked */

/* KVR_FFI_CDEF_BEGIN */
typedef struct kvr_ffi_vm kvr_ffi_vm_t;

struct kvr_ffi_header {
    const char *name;   /* lower-case header name */
    const char *value;  /* header value */
    uint32_t name_len;  /* bytes in name */
    uint32_t value_len; /* bytes in value */
};

struct kvr_ffi_request {
    const char *model;                    /* model name */
    const char *session;                  /* session key (e.g. x-session-id); NULL = none */
    const char *lora;                     /* LoRA adapter; NULL = none */
    const char *policy;                   /* policy name asked for by header; NULL = none */
    const struct kvr_ffi_header *headers; /* n_headers routing headers; may be NULL */
    const uint64_t *local_hashes;         /* `blocks` local block hashes (index queries) */
    const uint64_t *seq_hashes;           /* `blocks` sequence hashes; may be NULL */
    uint64_t request_id;                  /* the router's id for the request */
    double overlap_weight; /* per-request override of the prefill weight; < 0 unset */
    double temperature;    /* per-request override of the temperature; < 0 unset */
    uint32_t model_len;    /* bytes in model */
    uint32_t session_len;  /* bytes in session */
    uint32_t lora_len;     /* bytes in lora */
    uint32_t policy_len;   /* bytes in policy */
    uint32_t n_headers;    /* entries in headers */
    uint32_t tokens;       /* input length in tokens (isl) */
    uint32_t blocks;       /* complete blocks (length of the hash arrays) */
    uint32_t block_size;   /* tokens per block (> 0) */
    int32_t priority;      /* request priority (0 = default) */
    uint32_t pad_;         /* zero */
};

struct kvr_ffi_candidate {
    uint64_t worker_id;      /* worker instance id */
    const char *url;         /* worker endpoint; NULL = none */
    const char *labels;      /* "k=v,k=v" operator labels; NULL = none */
    double kv_usage;         /* KV cache utilisation 0..1; < 0 unknown */
    double weight;           /* operator weight (1 = neutral) */
    uint32_t dp_rank;        /* data-parallel rank */
    uint32_t url_len;        /* bytes in url */
    uint32_t labels_len;     /* bytes in labels */
    uint32_t healthy;        /* 1 healthy, 0 not (eligible but degraded) */
    uint32_t overlap;        /* device-tier blocks of the request already cached (index) */
    uint32_t overlap_host;   /* host-tier cached blocks beyond the device ones; 0 unknown */
    uint32_t overlap_disk;   /* disk-tier cached blocks beyond host and device; 0 unknown */
    uint32_t tree_blocks;    /* blocks the index holds for this rank (tie-break) */
    uint32_t prefill_tokens; /* active prefill tokens (load tracker) */
    uint32_t decode_blocks;  /* active decode blocks (load tracker) */
    uint32_t new_blocks;     /* request blocks not already active on the rank */
    uint32_t requests;       /* active requests (load tracker) */
    uint32_t queue;          /* requests waiting at the worker (metrics); 0 unknown */
    uint32_t pad_;           /* zero */
};

struct kvr_ffi_outcome {
    const char *error;      /* error text; NULL = none */
    double ttft_ms;         /* time to first token; < 0 unknown */
    double latency_ms;      /* total latency; < 0 unknown */
    uint32_t error_len;     /* bytes in error */
    int32_t status;         /* HTTP status from the worker; 0 = no response */
    uint32_t output_tokens; /* tokens generated */
    uint32_t pad_;          /* zero */
};

struct kvr_ffi_block {
    uint64_t block_hash;  /* external hash */
    uint64_t tokens_hash; /* local block hash */
};

struct kvr_ffi_event {
    uint64_t worker_id;                 /* emitting worker */
    uint64_t parent_hash;               /* stored: parent external hash, if has_parent */
    const struct kvr_ffi_block *blocks; /* stored: n blocks */
    const uint64_t *hashes;             /* removed: n external hashes */
    uint32_t dp_rank;                   /* emitting rank */
    uint32_t kind;                      /* 1 stored, 2 removed, 3 cleared */
    uint32_t tier;                      /* 0 device, 1 host_pinned, 2 disk, 3 external */
    uint32_t has_parent;                /* stored: 1 if parent_hash is set */
    uint32_t n;                         /* blocks or hashes */
    uint32_t pad_;                      /* zero */
};

struct kvr_ffi_match {
    uint64_t worker_id; /* rank's worker (or lane/pool id for lane queries) */
    uint32_t dp_rank;   /* rank's dp_rank */
    uint32_t blocks;    /* matched prefix in blocks (> 0) */
};

struct kvr_ffi_index_stats {
    uint64_t nodes;          /* tree nodes */
    uint64_t blocks;         /* blocks in the tree */
    uint64_t block_ranks;    /* (block, rank) ownership entries */
    uint64_t ranks;          /* registered ranks */
    uint64_t bytes;          /* bytes held by the tree */
    uint64_t events_stored;  /* stored events applied */
    uint64_t events_removed; /* removed events applied */
    uint64_t events_cleared; /* cleared events applied */
    uint64_t queries;        /* prefix queries answered */
};

struct kvr_ffi_load {
    uint64_t prefill_tokens; /* active prefill tokens */
    uint64_t active_blocks;  /* active decode blocks */
    uint64_t requests;       /* active requests */
};

struct kvr_ffi_call {
    const struct kvr_ffi_request *req;     /* current request */
    const struct kvr_ffi_candidate *cands; /* n candidates */
    const struct kvr_ffi_outcome *outcome; /* on_response: the outcome */
    const struct kvr_ffi_event *event;     /* KV-event hooks: the event */
    kvr_ffi_vm_t *vm;                      /* opaque; passed back to the api calls */
    double overlap_weight;                 /* req->overlap_weight (copies of the request's */
    double temperature;                    /* req->temperature      numbers: the glue reads */
    uint32_t tokens;                       /* req->tokens           them without touching a */
    uint32_t blocks;                       /* req->blocks           pointer, so allocates */
    uint32_t block_size;                   /* req->block_size       nothing) */
    int32_t priority;                      /* req->priority */
    uint32_t n;                            /* candidates */
    uint32_t out_cap;                      /* entries of ranked the choice may fill (1..256) */
    uint32_t slot;                         /* policy slot to run */
    uint32_t pad_;                         /* zero */
    uint32_t ranked[256];                  /* out: chosen indices, best first */
};

struct kvr_ffi_api {
    uint32_t abi;  /* KVR_FFI_ABI */
    uint32_t size; /* sizeof(struct kvr_ffi_api) */
    int (*index_match)(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                       struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err);
    int (*index_match_tokens)(kvr_ffi_vm_t *vm, const uint32_t *tokens, size_t n,
                              uint32_t block_size, const char *lora, size_t lora_len,
                              struct kvr_ffi_match *out, size_t cap, size_t *n_out,
                              const char **err);
    int (*lanes_match)(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                       struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err);
    int (*index_stats)(kvr_ffi_vm_t *vm, struct kvr_ffi_index_stats *out, const char **err);
    int (*load_get)(kvr_ffi_vm_t *vm, uint64_t worker_id, uint32_t dp_rank,
                    struct kvr_ffi_load *out, const char **err);
    uint64_t (*hash)(const void *data, size_t len, uint64_t seed);
    double (*now)(void);
    int (*counter_id)(kvr_ffi_vm_t *vm, const char *name, size_t len, const char **err);
    void (*counter_add)(kvr_ffi_vm_t *vm, int id, uint64_t n);
    void (*log)(kvr_ffi_vm_t *vm, int level, const char *msg, size_t len);
    size_t (*u64_format)(uint64_t v, char *buf);
    int (*u64_parse)(const char *s, size_t len, uint64_t *out);
    int (*admin_dump)(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err);
    int (*admin_snapshot)(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err);
};
/* KVR_FFI_CDEF_END */

/* ==== the calls (api table entries) ========================================================== */

/* Prefix overlap of n local block hashes (borrowed) in the runtime's radix index: one entry per
 * rank with a non-zero score, written to out[0..cap) (Lua scratch). KVR_OK, KVR_ERANGE (*n_out =
 * count needed), KVR_ENOTFOUND (no index bound: *n_out = 0), KVR_ETIMEDOUT (deadline passed). */
int kvr_ffi_index_match(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                        struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err);

/* As kvr_ffi_index_match for n tokens (borrowed): hashes complete blocks of block_size tokens
 * (0 = the runtime's block size) with the LoRA salt (lora may be NULL), then queries. */
int kvr_ffi_index_match_tokens(kvr_ffi_vm_t *vm, const uint32_t *tokens, size_t n,
                               uint32_t block_size, const char *lora, size_t lora_len,
                               struct kvr_ffi_match *out, size_t cap, size_t *n_out,
                               const char **err);

/* Per-lane prefix depths from the CKF: the host's lane index (lua.h kvr_lua_engine.lanes), else
 * the CKF of the bound index (kind CKF or BOTH). One entry per lane with depth > 0.
 * KVR_ENOTFOUND when there is neither. */
int kvr_ffi_lanes_match(kvr_ffi_vm_t *vm, const uint64_t *locals, size_t n,
                        struct kvr_ffi_match *out, size_t cap, size_t *n_out, const char **err);

/* Index sizes and counters. KVR_OK or KVR_ENOTFOUND (no index bound). */
int kvr_ffi_index_stats(kvr_ffi_vm_t *vm, struct kvr_ffi_index_stats *out, const char **err);

/* Live load of one rank from the load tracker. KVR_OK (zeros for an unseen rank) or
 * KVR_ENOTFOUND (no tracker bound). */
int kvr_ffi_load_get(kvr_ffi_vm_t *vm, uint64_t worker_id, uint32_t dp_rank,
                     struct kvr_ffi_load *out, const char **err);

/* XXH3-64 of len bytes with seed. Pure. */
uint64_t kvr_ffi_hash(const void *data, size_t len, uint64_t seed);

/* Monotonic time in seconds. */
double kvr_ffi_now(void);

/* Id of the named user counter of the VM's current policy (registered on first use; names up
 * to 63 bytes of [A-Za-z0-9_.-]). Returns an id >= 0, or KVR_EINVAL / KVR_ECAPACITY. */
int kvr_ffi_counter_id(kvr_ffi_vm_t *vm, const char *name, size_t len, const char **err);
/* Adds n to a user counter (ids from kvr_ffi_counter_id; others are ignored). */
void kvr_ffi_counter_add(kvr_ffi_vm_t *vm, int id, uint64_t n);

/* Logs a policy message through the runtime's log callback (level: 0 error .. 3 debug),
 * rate-limited per VM. */
void kvr_ffi_log(kvr_ffi_vm_t *vm, int level, const char *msg, size_t len);

/* Decimal text of v into buf (at least 21 bytes, NUL-terminated); returns the length. */
size_t kvr_ffi_u64_format(uint64_t v, char *buf);
/* Parses an unsigned decimal (or 0x-prefixed hexadecimal) u64. KVR_OK or KVR_EINVAL. */
int kvr_ffi_u64_parse(const char *s, size_t len, uint64_t *out);

/* Operator scripts only (kvr_lua_script_run): ask the host to write a dump / a snapshot to path.
 * KVR_ESTATE when called from a policy, KVR_ENOTFOUND when the host bound no handler. */
int kvr_ffi_admin_dump(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err);
int kvr_ffi_admin_snapshot(kvr_ffi_vm_t *vm, const char *path, size_t len, const char **err);

/* The api table handed to every Lua state (static, read-only). */
const struct kvr_ffi_api *kvr_ffi_api(void);

#endif
