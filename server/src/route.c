/* route.c - candidates, overlap, load, policy, booking (see route.h). */
#include "route.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvr/err.h"
#include "kvr/load.h"
#include "models.h"
#include "policy.h"

#define STACK_CANDS 64

static uint32_t overlap_of(const struct kvr_match *mt, size_t n, uint64_t wid, uint32_t rank)
{
    for (size_t k = 0; k < n; k++)
        if (mt[k].worker_id == wid && mt[k].dp_rank == rank)
            return mt[k].blocks;
    return 0;
}

static uint64_t tree_of(const struct kvr_rank_blocks *rb, size_t n, uint64_t wid, uint32_t rank)
{
    for (size_t k = 0; k < n; k++)
        if (rb[k].worker_id == wid && rb[k].dp_rank == rank)
            return rb[k].blocks;
    return 0;
}

static void write_scores(struct srv_jw *w, const struct srv_cand *all, size_t n_all,
                         const struct srv_policy_cand *pc, const size_t *map, size_t n_el)
{
    srv_jw_key(w, "candidates");
    srv_jw_char(w, '[');
    size_t e = 0;
    for (size_t k = 0; k < n_all; k++) {
        if (k > 0)
            srv_jw_char(w, ',');
        srv_jw_raw(w, "{\"worker_id\":");
        srv_jw_u64(w, all[k].w->id);
        srv_jw_raw(w, ",\"dp_rank\":");
        srv_jw_u64(w, all[k].dp_rank);
        srv_jw_raw(w, ",\"eligible\":");
        int el = e < n_el && map[e] == k;
        srv_jw_bool(w, el);
        if (el) {
            const struct srv_policy_cand *c = &pc[e++];
            srv_jw_raw(w, ",\"overlap_blocks\":");
            srv_jw_u64(w, c->overlap);
            srv_jw_raw(w, ",\"tree_blocks\":");
            srv_jw_u64(w, c->tree_blocks);
            srv_jw_raw(w, ",\"prefill_tokens\":");
            srv_jw_u64(w, c->prefill_tokens);
            srv_jw_raw(w, ",\"decode_blocks\":");
            srv_jw_u64(w, c->decode_blocks);
            srv_jw_raw(w, ",\"new_blocks\":");
            srv_jw_u64(w, c->new_blocks);
            srv_jw_raw(w, ",\"requests\":");
            srv_jw_u64(w, c->requests);
            srv_jw_raw(w, ",\"cost\":");
            srv_jw_dbl(w, c->cost);
        }
        srv_jw_char(w, '}');
    }
    srv_jw_char(w, ']');
}

int srv_route_decide(struct srv_thread *t, const struct srv_route_in *in, struct srv_decision *d,
                     char *err, size_t err_len)
{
    struct srv *s = t->srv;
    struct srv_model *m = in->m;
    uint64_t now = srv_now_ms();
    memset(d, 0, sizeof(*d));
    d->m = m;
    d->n_blocks = (uint32_t)in->n_blocks;
    d->isl = in->isl;

    struct srv_cand cs[STACK_CANDS], *all = cs;
    size_t n_all = srv_workers_candidates(&s->workers, m, now, cs, STACK_CANDS);
    if (n_all > STACK_CANDS) {
        for (;;) { /* the list may grow between the two calls */
            struct srv_cand *h = all == cs ? NULL : all;
            size_t cap = n_all + 16;
            struct srv_cand *v = realloc(h, cap * sizeof(*v));
            if (v == NULL) {
                free(h);
                return KVR_ENOMEM;
            }
            all = v;
            n_all = srv_workers_candidates(&s->workers, m, now, all, cap);
            if (n_all <= cap)
                break;
        }
    }
    int rc = KVR_OK;
    struct srv_policy_cand pcs[STACK_CANDS], *pc = pcs;
    struct kvr_load_query lqs[STACK_CANDS], *lq = lqs;
    size_t maps[STACK_CANDS], *map = maps;
    uint32_t ranked[SRV_MAX_ALT + 1];
    if (n_all == 0) {
        snprintf(err, err_len, "no worker is registered for model %s", m->key);
        rc = KVR_ENOTFOUND;
        goto out;
    }
    if (n_all > STACK_CANDS) {
        pc = malloc(n_all * sizeof(*pc));
        lq = malloc(n_all * sizeof(*lq));
        map = malloc(n_all * sizeof(*map));
        if (pc == NULL || lq == NULL || map == NULL) {
            rc = KVR_ENOMEM;
            goto out;
        }
    }
    size_t n = 0;
    for (size_t k = 0; k < n_all; k++)
        if (all[k].eligible && (!in->need_url || all[k].w->url != NULL))
            map[n++] = k;
    if (n == 0) {
        snprintf(err, err_len,
                 "no eligible worker for model %s (%zu registered: unhealthy, circuit open%s)",
                 m->key, n_all, in->need_url ? " or without an HTTP url" : "");
        rc = KVR_EBUSY;
        goto out;
    }

    /* overlap from the index */
    size_t nm = 0;
    if (in->n_blocks > 0) {
        if (srv_scratch_matches(t, 64) != KVR_OK) {
            rc = KVR_ENOMEM;
            goto out;
        }
        rc = kvr_index_find_matches(m->index, in->locals, in->n_blocks, 0, t->matches,
                                    t->cap_matches, &nm);
        if (rc == KVR_ERANGE) {
            if (srv_scratch_matches(t, nm) != KVR_OK) {
                rc = KVR_ENOMEM;
                goto out;
            }
            rc = kvr_index_find_matches(m->index, in->locals, in->n_blocks, 0, t->matches,
                                        t->cap_matches, &nm);
        }
        if (rc != KVR_OK)
            nm = 0;
        rc = KVR_OK;
    }
    /* tree sizes (tie-break), only when something matched */
    struct kvr_rank_blocks rbs[STACK_CANDS], *rb = rbs;
    size_t nrb = 0;
    if (nm > 0 && kvr_index_rank_blocks(m->index, rbs, STACK_CANDS, &nrb) == KVR_ERANGE) {
        rb = malloc(nrb * sizeof(*rb));
        if (rb == NULL || kvr_index_rank_blocks(m->index, rb, nrb, &nrb) != KVR_OK)
            nrb = 0;
    }
    for (size_t k = 0; k < n; k++) {
        const struct srv_cand *c = &all[map[k]];
        lq[k].worker_id = c->w->id;
        lq[k].dp_rank = c->dp_rank;
    }
    kvr_load_query(m->load, in->seqs, in->n_blocks, lq, n);
    for (size_t k = 0; k < n; k++) {
        const struct srv_cand *c = &all[map[k]];
        struct srv_policy_cand *p = &pc[k];
        p->worker_id = c->w->id;
        p->dp_rank = c->dp_rank;
        p->url = c->w->url;
        p->labels = c->w->labels;
        p->healthy = 1;
        p->overlap = nm > 0 ? overlap_of(t->matches, nm, c->w->id, c->dp_rank) : 0;
        uint64_t tb = nrb > 0 ? tree_of(rb, nrb, c->w->id, c->dp_rank) : 0;
        p->tree_blocks = tb > UINT32_MAX ? UINT32_MAX : (uint32_t)tb;
        p->prefill_tokens = lq[k].prefill_tokens;
        p->decode_blocks = lq[k].active_blocks;
        p->new_blocks = lq[k].known ? lq[k].new_blocks : in->n_blocks;
        p->requests = lq[k].requests;
        p->cost = NAN;
    }
    if (rb != rbs)
        free(rb);

    struct srv_policy_req rq = {.model = m->key,
                                .session = in->session,
                                .session_len = in->session_len,
                                .lora = in->lora,
                                .lora_len = in->lora_len,
                                .policy = in->policy,
                                .policy_len = in->policy_len,
                                .headers = in->headers,
                                .n_headers = in->n_headers,
                                .locals = in->locals,
                                .seqs = in->seqs,
                                .request_id = 0,
                                .overlap_weight = in->overlap_weight,
                                .temperature = in->temperature,
                                .isl = in->isl,
                                .blocks = (uint32_t)in->n_blocks,
                                .block_size = m->block_size};
    d->request_id = srv_model_next_request_id(m) | (in->need_url ? SRV_REQ_ID_PROXY : 0);
    rq.request_id = d->request_id;
    struct srv_policy_out po = {.ranked = ranked, .cap = SRV_MAX_ALT + 1};
    rc = srv_policy_select(t, m, &rq, pc, n, &po);
    if (rc != KVR_OK || po.n == 0) {
        snprintf(err, err_len, "the policy could not decide");
        rc = rc != KVR_OK ? rc : KVR_EINVAL;
        goto out;
    }
    d->fallback = po.fallback;
    d->policy = po.policy;
    /* routing as a service: nobody retries here, a valid first choice is the whole answer */
    int one = !in->need_url && ranked[0] < n;
    if (!one && po.n < SRV_MAX_ALT + 1 && po.n < n) {
        /* retry alternatives when the policy named fewer: the rest by the classic cost */
        uint32_t alt[SRV_MAX_ALT + 1];
        struct srv_policy_out bo = {.ranked = alt, .cap = SRV_MAX_ALT + 1};
        double w = in->overlap_weight >= 0 ? in->overlap_weight : m->overlap_weight;
        srv_policy_builtin_rank(w, 0, &rq, pc, n, 0, &bo);
        for (size_t k = 0; k < bo.n && po.n < SRV_MAX_ALT + 1; k++) {
            int dup = 0;
            for (size_t j = 0; j < po.n && !dup; j++)
                dup = ranked[j] == alt[k];
            if (!dup)
                ranked[po.n++] = alt[k];
        }
    }
    for (size_t k = 0; k < po.n && d->n_pick < (one ? 1u : SRV_MAX_ALT + 1); k++) {
        if (ranked[k] >= n)
            continue;
        const struct srv_cand *c = &all[map[ranked[k]]];
        struct srv_pick *p = &d->pick[d->n_pick++];
        srv_worker_ref(c->w);
        p->w = c->w;
        p->dp_rank = c->dp_rank;
        p->overlap = pc[ranked[k]].overlap;
    }
    if (d->n_pick == 0) {
        snprintf(err, err_len, "the policy returned no valid candidate");
        rc = KVR_EINVAL;
        goto out;
    }
    if (in->scores != NULL)
        write_scores(in->scores, all, n_all, pc, map, n);
    srv_stat_add_shared(&d->pick[0].w->decisions, 1);
    srv_stat_add_shared(&m->route_decisions, 1);
    srv_stat_add(&t->st.route_decisions, 1);
    srv_hist_observe(&t->st.overlap, srv_hist_blocks(), d->pick[0].overlap);
    srv_hist_observe(&t->st.hit_ratio, srv_hist_ratio(),
                     in->n_blocks ? (uint64_t)d->pick[0].overlap * 1000 / in->n_blocks : 0);
out:
    if (all != cs)
        free(all);
    if (pc != pcs)
        free(pc);
    if (lq != lqs)
        free(lq);
    if (map != maps)
        free(map);
    if (rc == KVR_ENOTFOUND || rc == KVR_EBUSY)
        srv_stat_add(&t->st.route_no_worker, 1);
    return rc;
}

int srv_route_book(struct srv_thread *t, struct srv_decision *d, const uint64_t *locals,
                   const uint64_t *seqs, size_t n_blocks)
{
    struct srv_pick *p = &d->pick[d->cur];
    uint64_t now = srv_now_ms();
    struct kvr_load_request rq = {.request_id = d->request_id,
                                  .worker_id = p->w->id,
                                  .dp_rank = p->dp_rank,
                                  .isl_tokens = d->isl,
                                  .overlap_blocks = p->overlap,
                                  .track_prefill = 1,
                                  .seq_hashes = n_blocks ? seqs : NULL,
                                  .n_hashes = n_blocks};
    int rc = kvr_load_add(d->m->load, &rq, now);
    if (rc != KVR_OK)
        return rc;
    d->booked = 1;
    d->first_token = 0;
    if (d->m->approx != NULL && n_blocks > 0 &&
        kvr_approx_record(d->m->approx, p->w->id, p->dp_rank, locals, n_blocks, now) == KVR_OK)
        srv_stat_add(&t->st.approx_recorded, 1);
    return KVR_OK;
}

void srv_route_first_token(struct srv_decision *d)
{
    if (d->booked && !d->first_token) {
        kvr_load_first_token(d->m->load, d->request_id, srv_now_ms());
        d->first_token = 1;
    }
}

void srv_route_release(struct srv_decision *d)
{
    if (d->booked) {
        kvr_load_release(d->m->load, d->request_id, srv_now_ms());
        d->booked = 0;
    }
}

int srv_route_next(struct srv_decision *d)
{
    srv_route_release(d);
    if (d->cur + 1 >= d->n_pick)
        return 0;
    d->cur++;
    return 1;
}

void srv_route_decision_free(struct srv_decision *d)
{
    srv_route_release(d);
    for (size_t k = 0; k < d->n_pick; k++)
        srv_worker_unref(d->pick[k].w);
    d->n_pick = 0;
}
