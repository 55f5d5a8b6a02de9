/* json.h - a small streaming JSON writer for the simulator's reports.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design: the writer keeps one frame per open container (is it an object, how many members so
 * far, is it written on one line) and inserts commas, newlines and two-space indentation itself,
 * so callers only say what comes next:
 *
 *   kvr_sim_jw_obj(w); kvr_sim_jw_key(w, "hit_ratio"); kvr_sim_jw_dbl(w, 0.5); kvr_sim_jw_end(w);
 *   ─▶ {\n  "hit_ratio": 0.5\n}
 *
 * Numbers: u64 as exact decimals; doubles with "%.6g" (enough for every figure in a report and
 * stable across runs: the same bits print the same text); NaN and infinities become null.
 * Strings are escaped per RFC 8259 (control characters as \u00XX). Output errors are sticky:
 * kvr_sim_jw_finish reports them once. Not thread-safe.
 */
#ifndef KVR_SIM_JSON_H
#define KVR_SIM_JSON_H

#include <stdint.h>
#include <stdio.h>

#define KVR_SIM_JW_DEPTH 16

struct kvr_sim_jw {
    FILE *f;                             /* borrowed */
    int depth;                           /* open containers */
    int err;                             /* sticky: a write failed or the nesting was wrong */
    int count[KVR_SIM_JW_DEPTH];         /* members written per level */
    unsigned char inl[KVR_SIM_JW_DEPTH]; /* level written on one line */
    unsigned char obj[KVR_SIM_JW_DEPTH]; /* level is an object (else an array) */
    unsigned char key;                   /* a key was just written (value expected) */
};

void kvr_sim_jw_init(struct kvr_sim_jw *w, FILE *f);
/* Opens an object / array (one_line: no newlines inside, for short number arrays). */
void kvr_sim_jw_obj(struct kvr_sim_jw *w);
void kvr_sim_jw_arr(struct kvr_sim_jw *w, int one_line);
/* Closes the innermost container. */
void kvr_sim_jw_end(struct kvr_sim_jw *w);
/* A member name (inside an object, before its value). */
void kvr_sim_jw_key(struct kvr_sim_jw *w, const char *k);
void kvr_sim_jw_str(struct kvr_sim_jw *w, const char *s);
void kvr_sim_jw_u64(struct kvr_sim_jw *w, uint64_t v);
void kvr_sim_jw_dbl(struct kvr_sim_jw *w, double v);
void kvr_sim_jw_bool(struct kvr_sim_jw *w, int v);
/* Shorthands: key + value. */
void kvr_sim_jw_kstr(struct kvr_sim_jw *w, const char *k, const char *s);
void kvr_sim_jw_ku64(struct kvr_sim_jw *w, const char *k, uint64_t v);
void kvr_sim_jw_kdbl(struct kvr_sim_jw *w, const char *k, double v);
/* Ends the document (a final newline). Returns 0, or -1 if anything failed. */
int kvr_sim_jw_finish(struct kvr_sim_jw *w);

#endif
