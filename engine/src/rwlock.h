/* rwlock.h - a writer-preferring reader-writer spin lock for short critical sections.
 *
 * Why not pthread_rwlock: the index's critical sections are microseconds long (one find_matches
 * walk, one bounded batch of block operations), while a futex sleep/wake hand-off costs tens of
 * microseconds on a virtual machine. With a sleeping lock every writer/reader hand-off pays that,
 * and a writer applying thousands of small events behind a busy reader slowed down more than
 * tenfold. Here waiters spin (CPU pause), then yield the CPU, so a hand-off between two running
 * threads costs a cache-line transfer, and an oversubscribed machine still makes progress. A
 * waiting reader spins for up to KVR_RW_READER_SPIN_NS (longer than a bounded write hold, so it
 * sees the next release while it has a core: one that yields early can lose its core for a time
 * slice and miss many releases); a writer waiting for readers to leave spins KVR_RW_SPINS pauses,
 * then yields.
 *
 *   state: bit 31 = a writer holds the lock; bits 0..30 = number of readers holding it
 *   writer_waiting: > 0 while a writer wants the lock; new readers then wait (writer preference)
 *   gen, waiting[2]: readers that had to wait count themselves in waiting[gen & 1]. A writer that
 *                    releases a bounded hold closes the generation (gen++) and lets in the
 *                    readers of the closed one: it spins until waiting[old & 1] drops to 0, at
 *                    most KVR_RW_LETIN_SPINS times and without yielding. Readers that start
 *                    waiting after the release count in the other slot and do not extend the
 *                    wait; a waiting reader that is descheduled cannot hold the writer for more
 *                    than the spin bound (an earlier design waited, yielding, for *any* waiting
 *                    reader: with more runnable threads than cores each yield could give a
 *                    reader a whole time slice, and a writer took 60x longer with 2 readers).
 *
 * Writers are serialised among themselves by `wmutex` (a pthread mutex: writers are rare and may
 * sleep), so at most one writer competes with the readers.
 */
#ifndef KVR_RWLOCK_H
#define KVR_RWLOCK_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define KVR_RW_WRITER 0x80000000u
#define KVR_RW_SPINS 256 /* pauses before a writer waiting for readers starts yielding */
#define KVR_RW_READER_SPIN_NS 100000u /* a waiting reader spins this long before yielding */
#define KVR_RW_LETIN_SPINS 256u       /* bound of a releasing writer's wait for the readers */

struct kvr_rwlock {
    atomic_uint state;
    atomic_uint writer_waiting;
    atomic_uint gen;        /* release generation */
    atomic_uint waiting[2]; /* readers waiting, by generation parity */
    pthread_mutex_t wmutex;
};

static inline void kvr_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins `*spins` times, then yields the CPU on every further call. */
static inline void kvr_backoff(int *spins)
{
    if (*spins < KVR_RW_SPINS) {
        (*spins)++;
        kvr_cpu_relax();
    } else {
        sched_yield();
    }
}

static inline int kvr_rwlock_init(struct kvr_rwlock *l)
{
    atomic_init(&l->state, 0);
    atomic_init(&l->writer_waiting, 0);
    atomic_init(&l->gen, 0);
    atomic_init(&l->waiting[0], 0);
    atomic_init(&l->waiting[1], 0);
    return pthread_mutex_init(&l->wmutex, NULL) == 0 ? 0 : -1;
}

static inline void kvr_rwlock_destroy(struct kvr_rwlock *l)
{
    pthread_mutex_destroy(&l->wmutex);
}

static inline int kvr_rwlock_try_rd(struct kvr_rwlock *l)
{
    if (atomic_load_explicit(&l->writer_waiting, memory_order_relaxed) != 0)
        return 0;
    unsigned s = atomic_load_explicit(&l->state, memory_order_relaxed);
    return (s & KVR_RW_WRITER) == 0 &&
           atomic_compare_exchange_weak_explicit(&l->state, &s, s + 1u, memory_order_acquire,
                                                 memory_order_relaxed);
}

static inline uint64_t kvr_rw_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* A waiting reader spins (checking the lock every pause) for KVR_RW_READER_SPIN_NS, long enough
 * to see a few bounded write holds end, and only then yields: a reader that yields while the
 * machine has more runnable threads than cores can lose its core for a time slice and miss the
 * writer's let-in windows for many holds. */
static inline void kvr_rwlock_rdlock(struct kvr_rwlock *l)
{
    if (kvr_rwlock_try_rd(l))
        return;
    unsigned g = atomic_load_explicit(&l->gen, memory_order_relaxed) & 1u;
    atomic_fetch_add_explicit(&l->waiting[g], 1, memory_order_relaxed);
    uint64_t t0 = 0;
    for (unsigned i = 1; !kvr_rwlock_try_rd(l); i++) {
        if (t0 == ~0ull) {
            sched_yield();
            continue;
        }
        kvr_cpu_relax();
        if ((i & 63u) == 0) {
            uint64_t now = kvr_rw_now_ns();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > KVR_RW_READER_SPIN_NS)
                t0 = ~0ull;
        }
    }
    atomic_fetch_sub_explicit(&l->waiting[g], 1, memory_order_relaxed);
}

static inline void kvr_rwlock_rdunlock(struct kvr_rwlock *l)
{
    atomic_fetch_sub_explicit(&l->state, 1u, memory_order_release);
}

/* Takes the lock exclusively; the caller must already hold wmutex (kvr_rwlock_wrlock does). */
static inline void kvr_rwlock_acquire_w(struct kvr_rwlock *l)
{
    int spins = 0;
    atomic_fetch_add_explicit(&l->writer_waiting, 1, memory_order_relaxed);
    for (;;) {
        unsigned expected = 0;
        if (atomic_compare_exchange_weak_explicit(&l->state, &expected, KVR_RW_WRITER,
                                                  memory_order_acquire, memory_order_relaxed))
            break;
        kvr_backoff(&spins);
    }
    atomic_fetch_sub_explicit(&l->writer_waiting, 1, memory_order_relaxed);
}

/* Lets the readers that are waiting now take the lock first, so a writer applying many bounded
 * holds back to back cannot keep them out; the lock must be free. Bounded: at most
 * KVR_RW_LETIN_SPINS pauses, no yield (see the header comment). */
static inline void kvr_rwlock_let_readers_in(struct kvr_rwlock *l)
{
    unsigned g = atomic_fetch_add_explicit(&l->gen, 1u, memory_order_relaxed) & 1u;
    for (unsigned i = 0;
         i < KVR_RW_LETIN_SPINS && atomic_load_explicit(&l->waiting[g], memory_order_relaxed) != 0;
         i++)
        kvr_cpu_relax();
}

static inline void kvr_rwlock_wrlock(struct kvr_rwlock *l)
{
    pthread_mutex_lock(&l->wmutex);
    kvr_rwlock_let_readers_in(l);
    kvr_rwlock_acquire_w(l);
}

static inline void kvr_rwlock_wrunlock(struct kvr_rwlock *l)
{
    atomic_store_explicit(&l->state, 0u, memory_order_release);
    pthread_mutex_unlock(&l->wmutex);
}

/* Between two bounded holds: releases the lock, lets waiting readers take it, takes it back. */
static inline void kvr_rwlock_breathe(struct kvr_rwlock *l)
{
    atomic_store_explicit(&l->state, 0u, memory_order_release);
    kvr_rwlock_let_readers_in(l);
    kvr_rwlock_acquire_w(l);
}

#endif
