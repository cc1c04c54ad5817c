/* toml-access.c — reading a parsed TOML document.
 *
 * Plain accessors assert the node type (calling them on the wrong type is a
 * programmer error); the spn_toml_get* family walks a dotted path, checks the
 * type and reports bad input with the document name and the position of the
 * offending node, so callers can pass the message on to the user unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toml-internal.h"

const spn_toml_node_t *spn_toml_doc_root(const spn_toml_doc_t *doc) {
  SPN_ASSERT(doc);
  return doc->root;
}

const char *spn_toml_doc_name(const spn_toml_doc_t *doc) {
  SPN_ASSERT(doc);
  return doc->name;
}

spn_toml_type_t spn_toml_node_type(const spn_toml_node_t *n) {
  SPN_ASSERT(n);
  return n->type;
}

const char *spn_toml_type_name(spn_toml_type_t t) {
  switch (t) {
  case SPN_TOML_TABLE: return "table";
  case SPN_TOML_ARRAY: return "array";
  case SPN_TOML_STRING: return "string";
  case SPN_TOML_INTEGER: return "integer";
  case SPN_TOML_FLOAT: return "float";
  case SPN_TOML_BOOL: return "boolean";
  case SPN_TOML_DATETIME: return "datetime";
  case SPN_TOML_DATETIME_LOCAL: return "datetime-local";
  case SPN_TOML_DATE_LOCAL: return "date-local";
  case SPN_TOML_TIME_LOCAL: return "time-local";
  }
  return "unknown";
}

spn_toml_pos_t spn_toml_node_pos(const spn_toml_node_t *n) {
  SPN_ASSERT(n);
  return n->pos;
}

const spn_toml_doc_t *spn_toml_node_doc(const spn_toml_node_t *n) {
  SPN_ASSERT(n);
  return n->doc;
}

const char *spn_toml_node_where(const spn_toml_node_t *n, char *buf, size_t size) {
  SPN_ASSERT(n && buf && size > 0);
  snprintf(buf, size, "%s:%u:%u", n->doc->name, n->pos.line, n->pos.col);
  return buf;
}

size_t spn_toml_table_len(const spn_toml_node_t *table) {
  SPN_ASSERT(table && table->type == SPN_TOML_TABLE);
  return table->u.tab.len;
}

const char *spn_toml_table_key_at(const spn_toml_node_t *table, size_t i, spn_toml_pos_t *key_pos) {
  SPN_ASSERT(table && table->type == SPN_TOML_TABLE);
  if (i >= table->u.tab.len)
    return NULL;
  if (key_pos)
    *key_pos = table->u.tab.ents[i].kpos;
  return table->u.tab.ents[i].key;
}

const spn_toml_node_t *spn_toml_table_value_at(const spn_toml_node_t *table, size_t i) {
  SPN_ASSERT(table && table->type == SPN_TOML_TABLE);
  return i < table->u.tab.len ? table->u.tab.ents[i].val : NULL;
}

size_t spn_toml_table_key_len(const spn_toml_node_t *table, size_t i) {
  SPN_ASSERT(table && table->type == SPN_TOML_TABLE);
  return i < table->u.tab.len ? table->u.tab.ents[i].klen : 0;
}

static const spn_toml_entry_t *find_entry(const spn_toml_node_t *t, const char *k, size_t n) {
  uint32_t h = 2166136261u; /* FNV-1a, as the parser hashes keys */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)k[i];
    h *= 16777619u;
  }
  if (t->u.tab.nslots) {
    size_t mask = t->u.tab.nslots - 1;
    for (size_t s = h & mask;; s = (s + 1) & mask) {
      uint32_t v = t->u.tab.slots[s];
      if (!v)
        return NULL;
      const spn_toml_entry_t *e = &t->u.tab.ents[v - 1];
      if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0)
        return e;
    }
  }
  for (size_t i = 0; i < t->u.tab.len; i++) {
    const spn_toml_entry_t *e = &t->u.tab.ents[i];
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0)
      return e;
  }
  return NULL;
}

const spn_toml_node_t *spn_toml_table_get(const spn_toml_node_t *table, const char *key, spn_toml_pos_t *key_pos) {
  SPN_ASSERT(table && table->type == SPN_TOML_TABLE && key);
  const spn_toml_entry_t *e = find_entry(table, key, strlen(key));
  if (!e)
    return NULL;
  if (key_pos)
    *key_pos = e->kpos;
  return e->val;
}

size_t spn_toml_array_len(const spn_toml_node_t *array) {
  SPN_ASSERT(array && array->type == SPN_TOML_ARRAY);
  return array->u.arr.len;
}

const spn_toml_node_t *spn_toml_array_at(const spn_toml_node_t *array, size_t i) {
  SPN_ASSERT(array && array->type == SPN_TOML_ARRAY);
  return i < array->u.arr.len ? array->u.arr.items[i] : NULL;
}

const char *spn_toml_string(const spn_toml_node_t *n, size_t *len) {
  SPN_ASSERT(n && n->type == SPN_TOML_STRING);
  if (len)
    *len = n->u.str.len;
  return n->u.str.s;
}

int64_t spn_toml_int(const spn_toml_node_t *n) {
  SPN_ASSERT(n && n->type == SPN_TOML_INTEGER);
  return n->u.i;
}

double spn_toml_float(const spn_toml_node_t *n) {
  SPN_ASSERT(n && n->type == SPN_TOML_FLOAT);
  return n->u.f;
}

bool spn_toml_bool(const spn_toml_node_t *n) {
  SPN_ASSERT(n && n->type == SPN_TOML_BOOL);
  return n->u.b;
}

spn_toml_datetime_t spn_toml_datetime(const spn_toml_node_t *n) {
  SPN_ASSERT(n && (n->type == SPN_TOML_DATETIME || n->type == SPN_TOML_DATETIME_LOCAL ||
                   n->type == SPN_TOML_DATE_LOCAL || n->type == SPN_TOML_TIME_LOCAL));
  return n->u.dt;
}

/* ---- paths ------------------------------------------------------------------- */

static bool bare_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* The path up to byte `end`, for messages. */
static const char *prefix(char *buf, size_t size, const char *path, size_t end) {
  int n = end > 200 ? 200 : (int)end;
  snprintf(buf, size, "%.*s%s", n, path, end > 200 ? "..." : "");
  return buf;
}

int32_t spn_toml_get(const spn_toml_node_t *table, const char *path, spn_toml_type_t want, const spn_toml_node_t **out,
                     spn_error_t *err) {
  SPN_ASSERT(table && path);
  char where[300], pre[220];
  char key[512];
  const spn_toml_node_t *n = table;
  const char *name = table->doc->name;
  size_t i = 0, plen = strlen(path);
  if (out)
    *out = NULL;
  if (table->type != SPN_TOML_TABLE)
    return spn_error_set(err, SPN_EINVAL, "%s: lookup of \"%s\" from a %s, not a table", name, path,
                         spn_toml_type_name(table->type));
  if (plen == 0)
    return spn_error_set(err, SPN_EINVAL, "%s: empty key path", name);
  for (;;) {
    /* One key segment. */
    size_t seg_start = i, kl = 0;
    if (path[i] == '"' || path[i] == '\'') {
      char q = path[i++];
      while (i < plen && path[i] != q) {
        char c = path[i++];
        if (q == '"' && c == '\\' && i < plen)
          c = path[i++];
        if (kl + 1 >= sizeof key)
          return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" has a key that is too long", name, path);
        key[kl++] = c;
      }
      if (i >= plen)
        return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" has an unterminated quote", name, path);
      i++;
    } else {
      while (i < plen && bare_char(path[i])) {
        if (kl + 1 >= sizeof key)
          return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" has a key that is too long", name, path);
        key[kl++] = path[i++];
      }
      if (kl == 0)
        return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" is malformed at byte %zu", name, path, i + 1);
    }
    key[kl] = '\0';
    if (n->type != SPN_TOML_TABLE)
      return spn_error_set(err, SPN_ETYPE, "%s: %s: expected table, got %s", spn_toml_node_where(n, where, sizeof where),
                           prefix(pre, sizeof pre, path, seg_start ? seg_start - 1 : 0), spn_toml_type_name(n->type));
    const spn_toml_entry_t *e = find_entry(n, key, kl);
    if (!e) {
      if (seg_start == 0)
        return spn_error_set(err, SPN_ENOENT, "%s: no key \"%s\" in the top-level table",
                             spn_toml_node_where(n, where, sizeof where), key);
      return spn_error_set(err, SPN_ENOENT, "%s: no key \"%s\" in table %s", spn_toml_node_where(n, where, sizeof where),
                           key, prefix(pre, sizeof pre, path, seg_start - 1));
    }
    n = e->val;
    /* Any number of [index] suffixes. */
    while (i < plen && path[i] == '[') {
      size_t open = i++;
      size_t idx = 0, nd = 0;
      while (i < plen && path[i] >= '0' && path[i] <= '9') {
        if (idx > (SIZE_MAX - 9) / 10)
          return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" has an index that is too large", name, path);
        idx = idx * 10 + (size_t)(path[i++] - '0');
        nd++;
      }
      if (nd == 0 || i >= plen || path[i] != ']')
        return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" has a malformed index at byte %zu", name, path,
                             open + 1);
      i++;
      if (n->type != SPN_TOML_ARRAY)
        return spn_error_set(err, SPN_ETYPE, "%s: %s: expected array, got %s",
                             spn_toml_node_where(n, where, sizeof where), prefix(pre, sizeof pre, path, open),
                             spn_toml_type_name(n->type));
      if (idx >= n->u.arr.len)
        return spn_error_set(err, SPN_ENOENT, "%s: %s: index %zu out of range (the array has %zu elements)",
                             spn_toml_node_where(n, where, sizeof where), prefix(pre, sizeof pre, path, open), idx,
                             n->u.arr.len);
      n = n->u.arr.items[idx];
    }
    if (i == plen)
      break;
    if (path[i] != '.')
      return spn_error_set(err, SPN_EINVAL, "%s: key path \"%s\" is malformed at byte %zu", name, path, i + 1);
    i++;
  }
  if (want && n->type != want)
    return spn_error_set(err, SPN_ETYPE, "%s: %s: expected %s, got %s", spn_toml_node_where(n, where, sizeof where),
                         prefix(pre, sizeof pre, path, plen), spn_toml_type_name(want), spn_toml_type_name(n->type));
  if (out)
    *out = n;
  return SPN_OK;
}

int32_t spn_toml_get_string(const spn_toml_node_t *table, const char *path, const char **out, spn_error_t *err) {
  const spn_toml_node_t *n;
  int32_t rc = spn_toml_get(table, path, SPN_TOML_STRING, &n, err);
  if (rc < 0)
    return rc;
  *out = n->u.str.s;
  return SPN_OK;
}

int32_t spn_toml_get_int(const spn_toml_node_t *table, const char *path, int64_t *out, spn_error_t *err) {
  const spn_toml_node_t *n;
  int32_t rc = spn_toml_get(table, path, SPN_TOML_INTEGER, &n, err);
  if (rc < 0)
    return rc;
  *out = n->u.i;
  return SPN_OK;
}

int32_t spn_toml_get_float(const spn_toml_node_t *table, const char *path, double *out, spn_error_t *err) {
  const spn_toml_node_t *n;
  int32_t rc = spn_toml_get(table, path, 0, &n, err);
  if (rc < 0)
    return rc;
  if (n->type == SPN_TOML_FLOAT) {
    *out = n->u.f;
  } else if (n->type == SPN_TOML_INTEGER) {
    *out = (double)n->u.i;
  } else {
    char where[300];
    return spn_error_set(err, SPN_ETYPE, "%s: %s: expected float, got %s", spn_toml_node_where(n, where, sizeof where),
                         path, spn_toml_type_name(n->type));
  }
  return SPN_OK;
}

int32_t spn_toml_get_bool(const spn_toml_node_t *table, const char *path, bool *out, spn_error_t *err) {
  const spn_toml_node_t *n;
  int32_t rc = spn_toml_get(table, path, SPN_TOML_BOOL, &n, err);
  if (rc < 0)
    return rc;
  *out = n->u.b;
  return SPN_OK;
}
