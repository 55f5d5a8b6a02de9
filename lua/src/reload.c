/* reload.c - install-time validation of a policy in a scratch state: compile, run the chunk,
 * selftest(), synthetic decisions (see kvr_lua_policy_install in kvr/lua.h).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Everything runs interpreted (JIT off for the policy, even a trusted one) under the count hook,
 * so a policy that loops, allocates without bound or returns garbage is refused before any
 * worker loads it. The synthetic inputs are deterministic (seeded by the runtime seed and the
 * policy name) and cover the shapes real requests take: 1, 2, 3, 8, 64 and 256 candidates,
 * worker ids above 2^53, several dp ranks, unhealthy candidates (all of them once), no overlap
 * and full overlap, requests with and without session, LoRA, headers and hashes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kvr/err.h"
#include "kvr/hash.h"

#define MAX_SYN_CANDS 256u
#define MAX_SYN_BLOCKS 256u

static uint64_t mix(uint64_t *st)
{
    uint64_t z = (*st += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct synthetic {
    struct kvr_ffi_request req;
    struct kvr_ffi_header hdr[2];
    uint64_t locals[MAX_SYN_BLOCKS];
    uint64_t seqs[MAX_SYN_BLOCKS];
    struct kvr_ffi_candidate c[MAX_SYN_CANDS];
    char urls[MAX_SYN_CANDS][32];
};

static const size_t SIZES[] = {1, 2, 3, 8, 64, 256};

/* Fills decision k of the synthetic set; returns its candidate count. */
static size_t synthesize(struct synthetic *s, uint64_t *rng, unsigned k)
{
    memset(&s->req, 0, sizeof(s->req));
    size_t n = SIZES[k % (sizeof(SIZES) / sizeof(SIZES[0]))];
    uint32_t bs = (k % 3 == 0) ? 16 : 32;
    uint32_t tokens = (uint32_t)(mix(rng) % 4000) + (k % 5 == 0 ? 0 : 1);
    uint32_t blocks = tokens / bs;
    if (blocks > MAX_SYN_BLOCKS)
        blocks = MAX_SYN_BLOCKS;
    for (uint32_t i = 0; i < blocks; i++)
        s->locals[i] = mix(rng);
    kvr_hash_chain(s->locals, blocks, s->seqs);
    s->req.model = "synthetic-model";
    s->req.model_len = 15;
    if (k % 2) {
        s->req.session = "session-17";
        s->req.session_len = 10;
    }
    if (k % 4 == 1) {
        s->req.lora = "adapter-a";
        s->req.lora_len = 9;
    }
    if (k % 3 == 1) {
        s->hdr[0] = (struct kvr_ffi_header){"x-session-id", "abc", 12, 3};
        s->hdr[1] = (struct kvr_ffi_header){"x-tenant", "t1", 8, 2};
        s->req.headers = s->hdr;
        s->req.n_headers = 2;
    }
    s->req.local_hashes = blocks ? s->locals : NULL;
    s->req.seq_hashes = (blocks && k % 7) ? s->seqs : NULL;
    s->req.request_id = mix(rng);
    s->req.overlap_weight = (k % 6 == 5) ? 0.5 : -1;
    s->req.temperature = (k % 8 == 7) ? 0.7 : -1;
    s->req.tokens = tokens;
    s->req.blocks = blocks;
    s->req.block_size = bs;
    s->req.priority = (int32_t)(k % 3) - 1;
    int all_unhealthy = (k == 4);
    for (size_t i = 0; i < n; i++) {
        struct kvr_ffi_candidate *c = &s->c[i];
        memset(c, 0, sizeof(*c));
        c->worker_id = (k % 2) ? (0xF000000000000000ull | mix(rng)) : 1000 + i / 2;
        c->dp_rank = (uint32_t)(i % 2);
        int ul = snprintf(s->urls[i], sizeof(s->urls[i]), "http://10.0.0.%zu:8000", i);
        c->url = s->urls[i];
        c->url_len = (uint32_t)ul;
        c->labels = (i % 3) ? "zone=a,gpu=h100" : NULL;
        c->labels_len = c->labels ? 15 : 0;
        c->kv_usage = (i % 4 == 3) ? -1.0 : (double)(mix(rng) % 1000) / 1000.0;
        c->weight = 1.0;
        c->healthy = all_unhealthy ? 0 : (mix(rng) % 8 != 0);
        uint32_t ov = blocks ? (uint32_t)(mix(rng) % (blocks + 1)) : 0;
        c->overlap = (k % 5 == 2) ? blocks : ov;
        c->overlap_host = (uint32_t)(mix(rng) % 3);
        c->overlap_disk = 0;
        c->tree_blocks = (uint32_t)(mix(rng) % 100000);
        c->prefill_tokens = (uint32_t)(mix(rng) % 20000);
        c->decode_blocks = (uint32_t)(mix(rng) % 5000);
        c->new_blocks = blocks - (c->overlap < blocks ? c->overlap : blocks);
        c->requests = (uint32_t)(mix(rng) % 64);
        c->queue = (uint32_t)(mix(rng) % 8);
    }
    return n;
}

static int synthetic_decisions(kvr_lua_runtime_t *rt, struct lstate *s, const char *name,
                               int trusted, char *err, size_t err_len)
{
    struct synthetic *syn = malloc(sizeof(*syn));
    if (syn == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVR_LUA_ERRMEM;
    }
    uint64_t rng = rt->cfg.seed ^ kvr_hash_xxh3(name, strlen(name), 7);
    uint64_t t_end = kvr_lua_now_ns() + rt->cfg.load_budget_ns;
    int status = KVR_LUA_OK;
    for (unsigned k = 0; k < rt->cfg.synthetic_decisions; k++) {
        size_t n = synthesize(syn, &rng, k);
        lstate_set_request(s, &syn->req, syn->c, n, 8);
        s->call.slot = 0;
        char msg[ERR_CAP];
        uint64_t left = t_end > kvr_lua_now_ns() ? t_end - kvr_lua_now_ns() : 1;
        /* A trusted policy runs compiled in production: allow the interpreter 4x here. */
        uint64_t per = trusted ? rt->cfg.budget_ns * 4 : rt->cfg.budget_ns;
        uint64_t budget = left < per ? left : per;
        size_t got;
        uint64_t elapsed;
        int st = lstate_decide(s, budget, &got, &elapsed, msg, sizeof(msg));
        if (st != KVR_LUA_OK) {
            snprintf(err, err_len, "synthetic decision %u (%zu candidates, %u tokens): %s: %s", k,
                     n, syn->req.tokens, kvr_lua_status_name(st), msg);
            status = st;
            break;
        }
    }
    s->call.req = NULL;
    s->call.cands = NULL;
    s->call.n = 0;
    free(syn);
    return status;
}

int reload_validate(kvr_lua_runtime_t *rt, struct policy_def *p, char *err, size_t err_len)
{
    char msg[ERR_CAP];
    int st = lua_compile(p->name, p->source, p->source_len, &p->bytecode, &p->bytecode_len, msg,
                         sizeof(msg));
    if (st != KVR_LUA_OK) {
        snprintf(err, err_len, "%s", msg);
        return st;
    }
    struct lstate *s = NULL;
    st = lstate_new(rt, NULL, 0, rt->cfg.seed, &s, msg, sizeof(msg));
    if (st != KVR_LUA_OK) {
        snprintf(err, err_len, "scratch state: %s", msg);
        return st;
    }
    st = lstate_add_policy(s, p, 0, 0, 0, rt->cfg.load_budget_ns, msg, sizeof(msg));
    if (st != KVR_LUA_OK) {
        snprintf(err, err_len, "%s", msg);
        goto out;
    }
    s->fv.policy_id = p->id;
    if (s->hooks[0] & 16u) {
        lua_rawgeti(s->L, LUA_REGISTRYINDEX, s->refs[REF_SELFTEST]);
        lua_pushinteger(s->L, 0);
        st = lstate_pcall(s, 1, 0, rt->cfg.load_budget_ns, msg, sizeof(msg));
        if (st != KVR_LUA_OK) {
            snprintf(err, err_len, "selftest: %s", msg);
            goto out;
        }
    }
    st = synthetic_decisions(rt, s, p->name, (p->flags & KVR_LUA_TRUSTED) != 0, err, err_len);
out:
    lstate_free(s);
    return st;
}
