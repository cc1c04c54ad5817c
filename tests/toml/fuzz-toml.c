/* fuzz-toml.c — libFuzzer target for the TOML parser and access API.
 *
 * Every input either parses, and then the whole tree is read back through
 * the public accessors (and each top-level key through the path API), or it
 * fails with SPN_EPARSE and a message of the form "name:line:col: reason";
 * anything else aborts so the fuzzer reports it. The parser sources are
 * compiled into this program (not taken from libspindle) so that they carry
 * the fuzzer's coverage instrumentation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/toml.h"

static unsigned walk(const spn_toml_node_t *n, unsigned depth) {
  unsigned count = 1;
  if (depth > 300) /* the parser caps nesting at 256 */
    abort();
  switch (spn_toml_node_type(n)) {
  case SPN_TOML_TABLE:
    for (size_t i = 0; i < spn_toml_table_len(n); i++) {
      spn_toml_pos_t kp;
      const char *k = spn_toml_table_key_at(n, i, &kp);
      if (!k || kp.line == 0 || kp.col == 0)
        abort();
      const spn_toml_node_t *v = spn_toml_table_value_at(n, i);
      /* A key without NUL bytes must be found again by name. */
      if (strlen(k) == spn_toml_table_key_len(n, i) && spn_toml_table_get(n, k, NULL) != v)
        abort();
      count += walk(v, depth + 1);
    }
    break;
  case SPN_TOML_ARRAY:
    for (size_t i = 0; i < spn_toml_array_len(n); i++)
      count += walk(spn_toml_array_at(n, i), depth + 1);
    break;
  case SPN_TOML_STRING: {
    size_t len;
    const char *s = spn_toml_string(n, &len);
    if (s[len] != '\0')
      abort();
    break;
  }
  case SPN_TOML_INTEGER: (void)spn_toml_int(n); break;
  case SPN_TOML_FLOAT: (void)spn_toml_float(n); break;
  case SPN_TOML_BOOL: (void)spn_toml_bool(n); break;
  default: {
    spn_toml_datetime_t dt = spn_toml_datetime(n);
    if (dt.month < 0 || dt.month > 12 || dt.hour > 23 || dt.nanosecond < 0 || dt.nanosecond > 999999999)
      abort();
  }
  }
  return count;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse((const char *)data, size, "fuzz.toml", &doc, &err);
  if (rc < 0) {
    unsigned line, col;
    char c;
    if (rc != SPN_EPARSE || doc || sscanf(err.msg, "fuzz.toml:%u:%u%c", &line, &col, &c) != 3 || c != ':' ||
        line == 0 || col == 0)
      abort();
    return 0;
  }
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  walk(root, 0);
  /* The path API on each top-level bare key, with and without an index. */
  for (size_t i = 0; i < spn_toml_table_len(root) && i < 16; i++) {
    char path[96];
    const char *k = spn_toml_table_key_at(root, i, NULL);
    snprintf(path, sizeof path, "\"%.40s\"", k);
    if (!strchr(k, '"') && !strchr(k, '\\')) {
      const spn_toml_node_t *v = NULL;
      if (spn_toml_get(root, path, 0, &v, &err) == SPN_OK && strlen(k) == spn_toml_table_key_len(root, i) &&
          strlen(k) <= 40 && v != spn_toml_table_value_at(root, i))
        abort();
    }
    snprintf(path, sizeof path, "\"%.40s\"[0].x", k);
    (void)spn_toml_get(root, path, SPN_TOML_STRING, NULL, &err);
  }
  spn_toml_doc_free(&doc);
  if (doc)
    abort();
  return 0;
}
