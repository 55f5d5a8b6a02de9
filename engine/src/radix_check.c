/* radix_check.c - exhaustive invariant check of a radix tree (tests and debugging; O(size)). */
#include "radix_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvr/err.h"

__attribute__((format(printf, 3, 4))) static int fail(char *msg, size_t len, const char *fmt, ...)
{
    if (msg != NULL && len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
    }
    return KVR_ECORRUPT;
}

static int check_node(const struct kvr_radix *t, const struct rnode *n, uint64_t *cover_sum,
                      char *msg, size_t len)
{
    if (n->len == 0 || n->cap < n->len)
        return fail(msg, len, "node %u: len %u cap %u", n->id, n->len, n->cap);
    const struct rnode *p = n->parent;
    if (p == NULL || p->live != RNODE_LIVE)
        return fail(msg, len, "node %u: dead or missing parent", n->id);
    if (kvr_radix_kid_find(t, p, n->loc[0]) != n)
        return fail(msg, len, "node %u: not found among its parent's children", n->id);
    if (n->depth != p->depth + p->len)
        return fail(msg, len, "node %u: depth %u, parent ends at %u", n->id, n->depth,
                    p->depth + p->len);
    if (n->nkids > 0 && !full_any(n))
        return fail(msg, len, "node %u: has children but no full rank", n->id);
    if (!full_any(n) && n->ncut == 0 && n->nkids == 0)
        return fail(msg, len, "node %u: dead leaf still linked", n->id);
    if (n->nkids > 0 && !n->internal)
        return fail(msg, len, "node %u: has children but is not internal", n->id);
    if (n->split_next != NULL && (n->split_next->parent != n || n->split_next->live != RNODE_LIVE))
        return fail(msg, len, "node %u: split_next is not a live child", n->id);
    for (uint32_t w = 0; w <= n->nfullx; w++) {
        uint64_t bits = full_word(n, w);
        while (bits) {
            uint32_t slot = w * 64u + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1u;
            if (slot >= t->nslots || !t->ranks[slot].in_use)
                return fail(msg, len, "node %u: full bit for free slot %u", n->id, slot);
            cover_sum[slot] += n->len;
        }
    }
    for (uint32_t i = 0; i < n->ncut; i++) {
        const struct cut *c = &n->cut[i];
        if (c->k == 0 || c->k >= n->len)
            return fail(msg, len, "node %u: cutoff %u out of (0, %u)", n->id, c->k, n->len);
        if (c->slot >= t->nslots || !t->ranks[c->slot].in_use)
            return fail(msg, len, "node %u: cutoff for free slot %u", n->id, c->slot);
        if (full_has(n, c->slot))
            return fail(msg, len, "node %u: slot %u both full and cut", n->id, c->slot);
        for (uint32_t j = 0; j < i; j++)
            if (n->cut[j].slot == c->slot)
                return fail(msg, len, "node %u: slot %u cut twice", n->id, c->slot);
        cover_sum[c->slot] += c->k;
    }
    for (uint32_t i = 0; i < n->novr; i++) {
        const struct ovr *o = &n->ovr[i];
        if (i > 0 && (n->ovr[i - 1].pos > o->pos ||
                      (n->ovr[i - 1].pos == o->pos && n->ovr[i - 1].slot >= o->slot)))
            return fail(msg, len, "node %u: overrides not sorted", n->id);
        if (o->pos >= cover_of(n, o->slot))
            return fail(msg, len, "node %u: override at uncovered pos %u", n->id, o->pos);
        if (o->ext == rnode_ext(n)[o->pos])
            return fail(msg, len, "node %u: redundant override at %u", n->id, o->pos);
    }
    for (uint32_t i = 0, seen = 0; seen < n->nkids; i++) {
        const struct rnode *c = n->kids[i].n;
        if (c == NULL)
            continue;
        seen++;
        if (c->parent != n || c->live != RNODE_LIVE)
            return fail(msg, len, "node %u: child %u has another parent", n->id, c->id);
        if (n->kids[i].local != c->loc[0])
            return fail(msg, len, "node %u: child %u keyed wrongly", n->id, c->id);
    }
    return KVR_OK;
}

int kvr_radix_check(const kvr_radix_t *t, char *msg, size_t len)
{
    if (kvr_radix_busy(t)) {
        (void)fail(msg, len, "a job or deferred frees are in progress");
        return KVR_EBUSY;
    }
    uint64_t *cover_sum = calloc(t->nslots + 1u, sizeof(uint64_t));
    if (cover_sum == NULL)
        return KVR_ENOMEM;
    int rc = KVR_OK;
    size_t nodes = 0, blocks = 0;
    for (uint32_t id = 1; id < t->next_fresh && rc == KVR_OK; id++) {
        const struct rnode *n = rnode_get(t, id);
        if (n->live == RNODE_FREE)
            continue;
        if (n->live != RNODE_LIVE) {
            rc = fail(msg, len, "node %u: detached outside a drain", n->id);
            break;
        }
        nodes++;
        blocks += n->len;
        rc = check_node(t, n, cover_sum, msg, len);
    }
    if (rc == KVR_OK && (nodes != t->live_nodes || blocks != t->live_blocks))
        rc = fail(msg, len, "counts: %zu nodes / %zu blocks, recorded %zu / %zu", nodes, blocks,
                  t->live_nodes, t->live_blocks);
    /* Reachability: every live node hangs under the root. */
    if (rc == KVR_OK) {
        size_t reached = 0, cap = 64, top = 0;
        const struct rnode **stack = malloc(cap * sizeof(*stack));
        if (stack == NULL) {
            free(cover_sum);
            return KVR_ENOMEM;
        }
        stack[top++] = t->root;
        while (top > 0) {
            const struct rnode *n = stack[--top];
            for (uint32_t i = 0, seen = 0; seen < n->nkids; i++) {
                const struct rnode *c = n->kids[i].n;
                if (c == NULL)
                    continue;
                seen++;
                reached++;
                if (top == cap) {
                    cap *= 2;
                    const struct rnode **s = realloc(stack, cap * sizeof(*s));
                    if (s == NULL) {
                        free(stack);
                        free(cover_sum);
                        return KVR_ENOMEM;
                    }
                    stack = s;
                }
                stack[top++] = c;
            }
        }
        free(stack);
        if (reached != nodes)
            rc = fail(msg, len, "%zu live nodes, %zu reachable", nodes, reached);
    }
    size_t total = 0;
    for (uint32_t s = 0; s < t->nslots && rc == KVR_OK; s++) {
        const struct rank *r = &t->ranks[s];
        if (!r->in_use) {
            if (r->tab.count != 0)
                rc = fail(msg, len, "free slot %u has entries", s);
            continue;
        }
        uint32_t found;
        const struct extab *tab = &r->tab;
        total += tab->count;
        if (cover_sum[s] != tab->count) {
            rc = fail(msg, len, "slot %u covers %llu positions, has %u entries", s,
                      (unsigned long long)cover_sum[s], tab->count);
            break;
        }
        uint32_t counted = 0;
        for (uint32_t i = 0; i < tab->cap && rc == KVR_OK; i++) {
            const struct tent *e = &tab->e[i];
            if (e->node == 0)
                continue;
            counted++;
            if (e->node >= t->next_fresh) {
                rc = fail(msg, len, "slot %u: entry names node %u", s, e->node);
                break;
            }
            uint32_t pos;
            const struct rnode *n = kvr_radix_resolve_ro(t, e, &pos);
            if (n->live != RNODE_LIVE || n == t->root)
                rc = fail(msg, len, "slot %u: entry resolves to a dead node", s);
            else if (pos >= cover_of(n, s))
                rc = fail(msg, len, "slot %u: entry at uncovered pos %u of node %u", s, pos, n->id);
            else if (kvr_radix_tab_find(t, s, kvr_radix_ext_of(n, s, pos)) != e)
                rc = fail(msg, len, "slot %u: entry for node %u pos %u unreachable by probing", s,
                          n->id, pos);
        }
        if (rc == KVR_OK && counted != tab->count)
            rc = fail(msg, len, "slot %u: %u entries, count %u", s, counted, tab->count);
        if (rc == KVR_OK) {
            /* The registry finds the slot. */
            found = UINT32_MAX;
            for (uint32_t i = 0; i < t->rmap_cap; i++)
                if (t->rmap[i] == s + 1u)
                    found = s;
            if (found != s)
                rc = fail(msg, len, "slot %u missing from the rank map", s);
        }
    }
    if (rc == KVR_OK && total != t->block_ranks)
        rc = fail(msg, len, "block_ranks %zu, tables hold %zu", t->block_ranks, total);
    free(cover_sum);
    return rc;
}
