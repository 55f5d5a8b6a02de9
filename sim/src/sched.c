/* sched.c - binary min-heap of timed events (see sched.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"

void kvr_sim_sched_init(struct kvr_sim_sched *s)
{
    memset(s, 0, sizeof(*s));
}

void kvr_sim_sched_free(struct kvr_sim_sched *s)
{
    free(s->heap);
    kvr_sim_sched_init(s);
}

static int less(const struct kvr_sim_ev *a, const struct kvr_sim_ev *b)
{
    return a->time_us != b->time_us ? a->time_us < b->time_us : a->seq < b->seq;
}

int kvr_sim_sched_push(struct kvr_sim_sched *s, uint64_t time_us, uint32_t kind, uint32_t arg)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 256;
        struct kvr_sim_ev *nh = realloc(s->heap, ncap * sizeof(*nh));
        if (nh == NULL)
            return KVR_ENOMEM;
        s->heap = nh;
        s->cap = ncap;
    }
    struct kvr_sim_ev e = {time_us, s->next_seq++, kind, arg};
    size_t i = s->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!less(&e, &s->heap[parent]))
            break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = e;
    return KVR_OK;
}

int kvr_sim_sched_peek(const struct kvr_sim_sched *s, struct kvr_sim_ev *out)
{
    if (s->n == 0)
        return 0;
    if (out != NULL)
        *out = s->heap[0];
    return 1;
}

int kvr_sim_sched_pop(struct kvr_sim_sched *s, struct kvr_sim_ev *out)
{
    if (s->n == 0)
        return 0;
    if (out != NULL)
        *out = s->heap[0];
    struct kvr_sim_ev last = s->heap[--s->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n)
            break;
        if (c + 1 < s->n && less(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!less(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n > 0)
        s->heap[i] = last;
    return 1;
}
