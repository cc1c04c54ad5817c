/* spindle/toml.h — TOML 1.0.0 documents: parse, then read with type checks.
 *
 * A document owns every node in it; nodes are borrowed pointers valid until
 * spn_toml_doc_free(). Tables keep their keys in document order. Every key and
 * value remembers where it was written (1-based line and column, columns
 * counted in bytes), so code that validates a config can say
 * "pipeline.toml:12:7: ..." about any part of it.
 *
 * Documents are immutable after parsing: any number of threads may read one
 * at the same time.
 */
#ifndef SPINDLE_TOML_H
#define SPINDLE_TOML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spn_toml_doc spn_toml_doc_t;
typedef struct spn_toml_node spn_toml_node_t;

typedef enum spn_toml_type {
  SPN_TOML_TABLE = 1,
  SPN_TOML_ARRAY,
  SPN_TOML_STRING,
  SPN_TOML_INTEGER,
  SPN_TOML_FLOAT,
  SPN_TOML_BOOL,
  SPN_TOML_DATETIME,       /* offset date-time: 1979-05-27T07:32:00Z */
  SPN_TOML_DATETIME_LOCAL, /* 1979-05-27T07:32:00 */
  SPN_TOML_DATE_LOCAL,     /* 1979-05-27 */
  SPN_TOML_TIME_LOCAL,     /* 07:32:00 */
} spn_toml_type_t;

typedef struct spn_toml_pos {
  uint32_t line; /* 1-based */
  uint32_t col;  /* 1-based, in bytes */
} spn_toml_pos_t;

typedef struct spn_toml_datetime {
  int32_t year, month, day;           /* set for dates and date-times */
  int32_t hour, minute, second;       /* set for times and date-times */
  int32_t nanosecond;                 /* fractional seconds, truncated to ns */
  int32_t offset_minutes;             /* SPN_TOML_DATETIME only; Z is 0 */
} spn_toml_datetime_t;

/* Parse `len` bytes of TOML. `name` is used in error messages and positions
 * ("pipeline.toml"); it is copied. On error returns SPN_EPARSE (or SPN_ENOMEM)
 * and err->msg reads "name:line:col: reason". No recursion proportional to
 * the input: deep nesting is an error, never a stack overflow.
 * Ownership: caller owns *out (spn_toml_doc_free). Thread: any. */
SPN_API int32_t spn_toml_parse(const char *src, size_t len, const char *name,
                               spn_toml_doc_t **out, spn_error_t *err);
/* Read and parse a file; `path` is the name in messages. SPN_ENOENT/SPN_EIO
 * when it cannot be read. Ownership: caller owns *out. Thread: any. */
SPN_API int32_t spn_toml_parse_file(const char *path, spn_toml_doc_t **out, spn_error_t *err);
/* Free a document and every node in it; sets *doc to NULL. NULL is fine.
 * Ownership: consumes *doc. Thread: any. */
SPN_API void spn_toml_doc_free(spn_toml_doc_t **doc);

/* The root table. Ownership: borrowed from doc. Thread: any (a parsed document is read-only). */
SPN_API const spn_toml_node_t *spn_toml_doc_root(const spn_toml_doc_t *doc);
/* The name given to spn_toml_parse. Ownership: borrowed. Thread: any (a parsed document is read-only). */
SPN_API const char *spn_toml_doc_name(const spn_toml_doc_t *doc);

/* spn_toml_node_type: Ownership: arguments borrowed. Thread: any (a parsed document is read-only). */
SPN_API spn_toml_type_t spn_toml_node_type(const spn_toml_node_t *n);
/* "table", "array", "string", "integer", "float", "boolean", "datetime",
 * "datetime-local", "date-local", "time-local".
 * Ownership: borrowed (valid while its owner lives). Thread: any (a parsed document is read-only). */
SPN_API const char *spn_toml_type_name(spn_toml_type_t t);
/* Where the value starts in the source.
 * Ownership: arguments borrowed. Thread: any (a parsed document is read-only). */
SPN_API spn_toml_pos_t spn_toml_node_pos(const spn_toml_node_t *n);
/* The document a node belongs to. Ownership: borrowed. Thread: any (a parsed document is read-only). */
SPN_API const spn_toml_doc_t *spn_toml_node_doc(const spn_toml_node_t *n);
/* Writes "name:line:col" for the node into buf (always NUL-terminated);
 * returns buf. Ownership: borrowed (valid while its owner lives). Thread: any (a parsed document is read-only). */
SPN_API const char *spn_toml_node_where(const spn_toml_node_t *n, char *buf, size_t size);

/* Tables: entries in document order. key_at/pos may be NULL-checked:
 * out-of-range indexes return NULL. Ownership: arguments borrowed. Thread: any (a parsed document is read-only). */
SPN_API size_t spn_toml_table_len(const spn_toml_node_t *table);
SPN_API const char *spn_toml_table_key_at(const spn_toml_node_t *table, size_t i, spn_toml_pos_t *key_pos);
SPN_API const spn_toml_node_t *spn_toml_table_value_at(const spn_toml_node_t *table, size_t i);
/* Byte length of key i (keys written with \u0000 hold NUL bytes, so this can
 * exceed strlen); 0 when out of range. Thread: any. Ownership: arguments borrowed. */
SPN_API size_t spn_toml_table_key_len(const spn_toml_node_t *table, size_t i);
/* One key (not a dotted path); NULL if absent. key_pos (may be NULL) gets
 * where the key was written.
 * Ownership: borrowed from its argument. Thread: any (a parsed document is read-only). */
SPN_API const spn_toml_node_t *spn_toml_table_get(const spn_toml_node_t *table, const char *key,
                                                  spn_toml_pos_t *key_pos);

/* Arrays. Ownership: arguments borrowed. Thread: any (a parsed document is read-only). */
SPN_API size_t spn_toml_array_len(const spn_toml_node_t *array);
SPN_API const spn_toml_node_t *spn_toml_array_at(const spn_toml_node_t *array, size_t i);

/* Scalars. Calling one on a node of another type is a programmer error
 * (SPN_ASSERT); use the checked spn_toml_get_* below for input. Strings are
 * NUL-terminated; *len (may be NULL) gets the byte length, which can be
 * larger than strlen when the string holds \u0000.
 * Ownership: borrowed (valid while its owner lives). Thread: any (a parsed document is read-only). */
SPN_API const char *spn_toml_string(const spn_toml_node_t *n, size_t *len);
SPN_API int64_t spn_toml_int(const spn_toml_node_t *n);
SPN_API double spn_toml_float(const spn_toml_node_t *n);
SPN_API bool spn_toml_bool(const spn_toml_node_t *n);
SPN_API spn_toml_datetime_t spn_toml_datetime(const spn_toml_node_t *n);

/* Look up a dotted path from a table: `stage.batching.max_batch`; a segment
 * may be quoted ("a.\"b.c\".d") and may index an array (`stage[2].name`).
 * Returns SPN_ENOENT if any segment is missing (err: "name:line:col: no key
 * "x" in table ..."), SPN_ETYPE when the node exists with another type
 * (err: "pipeline.toml:12:7: stage.name: expected string, got integer").
 * want = 0 accepts any type. Ownership: *out borrowed. Thread: any. */
SPN_API int32_t spn_toml_get(const spn_toml_node_t *table, const char *path, spn_toml_type_t want,
                             const spn_toml_node_t **out, spn_error_t *err);
SPN_API int32_t spn_toml_get_string(const spn_toml_node_t *table, const char *path, const char **out,
                                    spn_error_t *err);
SPN_API int32_t spn_toml_get_int(const spn_toml_node_t *table, const char *path, int64_t *out,
                                 spn_error_t *err);
SPN_API int32_t spn_toml_get_bool(const spn_toml_node_t *table, const char *path, bool *out,
                                  spn_error_t *err);
/* Accepts integers too (converted). Ownership: arguments borrowed. Thread: any (a parsed document is read-only). */
SPN_API int32_t spn_toml_get_float(const spn_toml_node_t *table, const char *path, double *out,
                                   spn_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
