/* rwlock.h - a writer-preferring reader-writer spin lock for short critical sections.
 *
 * Why not pthread_rwlock: the index's critical sections are microseconds long (one find_matches
 * walk, one bounded batch of block operations), while a futex sleep/wake hand-off costs tens of
 * microseconds on a virtual machine. With a sleeping lock every writer/reader hand-off pays that,
 * and a writer applying thousands of small events behind a busy reader slowed down more than
 * tenfold. Here waiters spin briefly (CPU pause), then yield the CPU, so a hand-off between two
 * running threads costs a cache-line transfer, and an oversubscribed machine still makes progress.
 *
 *   state: bit 31 = a writer holds the lock; bits 0..30 = number of readers holding it
 *   writer_waiting: > 0 while a writer wants the lock; new readers then wait (writer preference)
 *   readers_waiting: readers spinning for the lock; a writer that just released a bounded hold
 *                    lets them in before taking the lock again
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

#define KVR_RW_WRITER 0x80000000u
#define KVR_RW_SPINS 256

struct kvr_rwlock {
    atomic_uint state;
    atomic_uint writer_waiting;
    atomic_uint readers_waiting;
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
    atomic_init(&l->readers_waiting, 0);
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

static inline void kvr_rwlock_rdlock(struct kvr_rwlock *l)
{
    if (kvr_rwlock_try_rd(l))
        return;
    int spins = 0;
    atomic_fetch_add_explicit(&l->readers_waiting, 1, memory_order_relaxed);
    while (!kvr_rwlock_try_rd(l))
        kvr_backoff(&spins);
    atomic_fetch_sub_explicit(&l->readers_waiting, 1, memory_order_relaxed);
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

/* Lets readers already waiting take the lock first (bounded), so a writer applying many small
 * events back to back cannot keep them out. */
static inline void kvr_rwlock_let_readers_in(struct kvr_rwlock *l)
{
    int spins = 0;
    for (int i = 0; i < 4 * KVR_RW_SPINS &&
                    atomic_load_explicit(&l->readers_waiting, memory_order_relaxed) != 0;
         i++)
        kvr_backoff(&spins);
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
