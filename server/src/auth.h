/* auth.h - who may use the protected routes (admin, worker changes, the indexer's writes).
 *
 * The rule (http.c applies it per route, docs/SERVER.md §2):
 *
 *   --admin-token T set   ─▶ the request must carry "Authorization: Bearer T" (the scheme is
 *                            case-insensitive, RFC 7235; the token is compared in constant time
 *                            with respect to its content) ─▶ else 401
 *   no token configured   ─▶ the peer must be a loopback address (127.0.0.0/8, ::1,
 *                            ::ffff:127.0.0.0/104) ─▶ else 403
 *
 * Pure functions on strings: no allocation, no state, thread-safe.
 */
#ifndef KVR_SRV_AUTH_H
#define KVR_SRV_AUTH_H

#include <stddef.h>

/* 1 if given[0..given_len) equals the NUL-terminated secret, else 0. The running time depends
 * on the two lengths only, never on where the bytes differ (no early exit). Borrows both. */
int srv_auth_token_equal(const char *given, size_t given_len, const char *secret);

/* 1 if the Authorization header value (NULL = absent) is "Bearer <secret>": scheme matched
 * case-insensitively, one or more spaces, then exactly the secret (nothing before or after).
 * Borrows both. */
int srv_auth_bearer_ok(const char *authorization, const char *secret);

/* 1 if addr (a numeric address as libevent reports the peer: "127.0.0.1", "::1",
 * "::ffff:127.0.0.1") is a loopback address; 0 for anything else, including NULL, names and
 * text that does not parse as an address. Borrows addr. */
int srv_auth_is_loopback(const char *addr);

#endif
