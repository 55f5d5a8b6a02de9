/* tokenize.h - turning prompts into tokens for routing, without running a model's tokenizer.
 *
 * Three sources of tokens, by model (config "tokenizer"):
 *   - token arrays in the request ("prompt": [1, 2, 3], "token_ids"): used as they are;
 *   - worker: the text is sent to a worker's POST /tokenize (vLLM and SGLang serve it; so does
 *     kvr-mock-worker) and its "tokens" are used, so blocks hash exactly as the engine's KV
 *     events do (proxy.c does the call; this file parses the answer);
 *   - bytes: an approximate tokenizer for approximate-mode models: the UTF-8 text is cut into
 *     chunks of byte_chunk bytes (1..4) and each chunk, packed little-endian and zero-padded,
 *     is one pseudo-token. Two prompts sharing a prefix share pseudo-tokens up to it, which is
 *     all an approximate index needs (it only ever compares the router's own hashes).
 * Chat messages are flattened to "role\ncontent\n" per message (text parts joined) before the
 * bytes tokenizer; the worker tokenizer receives the messages themselves.
 *
 * Thread-safety: pure functions.
 */
#ifndef KVR_SRV_TOKENIZE_H
#define KVR_SRV_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/buf.h"

struct json_object;

/* Number of pseudo-tokens for len bytes. */
static inline size_t srv_tok_bytes_count(size_t len, uint32_t chunk)
{
    return chunk == 0 ? 0 : (len + chunk - 1) / chunk;
}

/* Writes the pseudo-tokens of text[0..len) into out (room for srv_tok_bytes_count). Returns the
 * count. */
size_t srv_tok_bytes(const char *text, size_t len, uint32_t chunk, uint32_t *out);

/* Appends the flattened text of an OpenAI "messages" array (borrowed) to out. Returns KVR_OK,
 * KVR_ECORRUPT (not an array of {role, content}) or KVR_ENOMEM. */
int srv_tok_flatten_messages(struct json_object *messages, struct kvr_buf *out);

/* Parses a /tokenize answer (text[0..len)) and writes its "tokens" into out[0..cap); *n is the
 * count. KVR_OK, KVR_ECORRUPT, KVR_ERANGE (more than cap). */
int srv_tok_parse_answer(const char *text, size_t len, uint32_t *out, size_t cap, size_t *n);

#endif
