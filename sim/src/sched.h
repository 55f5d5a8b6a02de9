/* sched.h - the discrete-event queue of the simulator: a binary min-heap in virtual time.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. Virtual time is an integer number of microseconds (no floating-point drift, so a run
 * is bit-for-bit reproducible). Every entry carries a sequence number assigned at push time;
 * the heap orders by (time, seq), so entries due at the same instant come out in the order they
 * were scheduled and the whole simulation is deterministic.
 *
 *            (t=5,s=2)
 *           /         \          heap[i] <= heap[2i+1], heap[2i+2]
 *     (t=7,s=0)     (t=5,s=9)
 *
 * Not thread-safe.
 */
#ifndef KVR_SIM_SCHED_H
#define KVR_SIM_SCHED_H

#include <stddef.h>
#include <stdint.h>

struct kvr_sim_ev {
    uint64_t time_us; /* when it is due */
    uint64_t seq;     /* push order (tie-break) */
    uint32_t kind;    /* caller-defined */
    uint32_t arg;     /* caller-defined (a request index) */
};

struct kvr_sim_sched {
    struct kvr_sim_ev *heap; /* owned */
    size_t n, cap;
    uint64_t next_seq;
};

void kvr_sim_sched_init(struct kvr_sim_sched *s);
void kvr_sim_sched_free(struct kvr_sim_sched *s);

/* Schedules (time_us, kind, arg). KVR_OK or KVR_ENOMEM (queue unchanged). */
int kvr_sim_sched_push(struct kvr_sim_sched *s, uint64_t time_us, uint32_t kind, uint32_t arg);

/* The earliest entry: returns 1 and copies it to *out (may be NULL), or 0 when empty. */
int kvr_sim_sched_peek(const struct kvr_sim_sched *s, struct kvr_sim_ev *out);

/* Removes the earliest entry into *out; returns 1, or 0 when empty. */
int kvr_sim_sched_pop(struct kvr_sim_sched *s, struct kvr_sim_ev *out);

#endif
