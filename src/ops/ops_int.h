/* ops_int.h - private helpers shared by the files of src/ops/
 *
 * DESIGN: the one page reader every list uses (newest first by a date field, cursor paging),
 * array appends, and the RabbitMQ precondition. No operation lives here. */
#ifndef OBX_OPS_INT_H
#define OBX_OPS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "obx/obx_ops.h"

/* Appends doc / s as element i of the array being built in arr. */
void ops_array_doc(bson_t *arr, int i, const bson_t *doc);
void ops_array_utf8(bson_t *arr, int i, const char *s);

/* Reads one page of `collection` matching filter, sorted by {date_field: dir, id_field: dir}
 * (dir -1: newest first), with projection (may be NULL), into out as {items, count, next}.
 * The cursor is "<ms>~<id>" of the last item; page->after continues after it (a malformed
 * cursor is OBX_ERR_INPUT). id_field (a dotted path) must hold a unique string. */
bool ops_find_page(const obx_ops_t *ops, const char *collection, const bson_t *filter, const char *date_field,
                   const char *id_field, int dir, const bson_t *projection, const obx_ops_page_t *page, bson_t *out, obx_err_t *err);

/* obx_ops_counts on a client the caller popped. */
bool ops_counts_with(const obx_ops_t *ops, mongoc_client_t *client, obx_ops_store_t store, const char *org, bson_t *out,
                     obx_err_t *err);

/* OBX_ERR_AMQP (retriable) when ops has no ladder. */
bool ops_need_ladder(const obx_ops_t *ops, obx_err_t *err);

/* {$gte: since, $lte: until} on field when either is set. */
void ops_time_range(bson_t *filter, const char *field, int64_t since_ms, int64_t until_ms);

/* Publishes a stored inbox entry to the work queue (replay: run it even when DONE). */
bool ops_publish_entry(const obx_ops_t *ops, const bson_t *entry, const char *replay_id, obx_err_t *err);

#endif
