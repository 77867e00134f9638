/* obx_json.h - JSON at the edges: request bodies in, documents out to operators and clients
 *
 * DESIGN: one strict parser for every JSON request body and file (exactly one object; only
 * whitespace may follow it, so `{..}{..}` is refused instead of silently dropping the second
 * object), and one renderer of BSON as relaxed extended JSON, every date written as an RFC 3339
 * UTC string with milliseconds ("2026-12-01T13:00:00.123Z", never {"$date": ...}), that cannot
 * fail (every JSON document outboxctl prints and the HTTP API answers goes through it): libbson's
 * bson_as_relaxed_extended_json returns NULL for a document holding a string or key that is
 * not valid UTF-8 (a dead letter, an event written by another driver), and every caller that
 * printed or sent that NULL crashed or answered an empty body. obx_json_render writes such
 * strings and keys with each invalid byte replaced by U+FFFD (the Unicode replacement
 * character) and never returns NULL; a document that is not even valid BSON renders as
 * {"error": "not a valid BSON document"}. Pure functions, thread-safe. */
#ifndef OBX_JSON_H
#define OBX_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <bson/bson.h>
#include "obx_err.h"

/* Parses json[0..len) as one JSON object into out (initialised here in every case; the
 * caller destroys it). False (OBX_ERR_INPUT, the message says why: empty, not an object,
 * the parser's error, data after the object) otherwise. */
bool obx_json_parse(const char *json, size_t len, bson_t *out, obx_err_t *err);

/* Relaxed extended JSON of doc with dates as RFC 3339 strings, never NULL (see DESIGN); owned by the caller (bson_free).
 * *len (when not NULL) gets its length; *replaced (when not NULL) how many invalid bytes
 * were replaced. */
char *obx_json_render(const bson_t *doc, size_t *len, int *replaced);

/* s[0..len) with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD
 * (NUL bytes kept): owned (bson_free), NUL-terminated, its length in *out_len; *replaced
 * (when not NULL) gets how many bytes were replaced. */
char *obx_json_utf8_repair(const char *s, size_t len, size_t *out_len, int *replaced);

#endif
