/* toml-internal.h — the node layout shared by the parser and the access API.
 *
 * Nodes, keys and string values live in a per-document bump arena; the only
 * heap buffers outside it are the growable vectors of tables and arrays
 * (entries, hash slots, items), and the document keeps a flat list of every
 * container so that freeing never walks the tree (no recursion at all).
 */
#ifndef SPINDLE_TOML_INTERNAL_H
#define SPINDLE_TOML_INTERNAL_H

#include "spindle/toml.h"

/* Deepest nesting of tables and arrays a document may have, counting the
 * root as depth 0. Bounds the parser's recursion (inline arrays/tables) and
 * that of any reader walking the tree. */
#define SPN_TOML_MAX_DEPTH 256

/* Table flags: how a table came to exist. They carry the redefinition rules. */
enum {
  SPN_TOML_F_IMPLICIT = 1u << 0, /* created as a parent by a [a.b.c] header */
  SPN_TOML_F_EXPLICIT = 1u << 1, /* defined by its own [header] or [[header]] */
  SPN_TOML_F_DOTTED = 1u << 2,   /* created by a dotted key a.b = 1 */
  SPN_TOML_F_INLINE = 1u << 3,   /* inline table { }, frozen once closed */
  SPN_TOML_F_AOT = 1u << 4,      /* array built by [[header]] (not static) */
};

typedef struct spn_toml_entry {
  const char *key; /* arena, NUL-terminated; may hold NUL bytes itself */
  size_t klen;
  spn_toml_pos_t kpos;
  uint32_t hash;
  spn_toml_node_t *val;
} spn_toml_entry_t;

struct spn_toml_node {
  spn_toml_type_t type;
  uint16_t flags;
  uint16_t depth;
  spn_toml_pos_t pos;
  const spn_toml_doc_t *doc;
  union {
    struct {
      spn_toml_entry_t *ents;
      size_t len, cap;
      uint32_t *slots; /* open addressing: 0 empty, else entry index + 1 */
      size_t nslots;   /* 0 until the table grows past a few keys */
    } tab;
    struct {
      spn_toml_node_t **items;
      size_t len, cap;
    } arr;
    struct {
      const char *s;
      size_t len;
    } str;
    int64_t i;
    double f;
    bool b;
    spn_toml_datetime_t dt;
  } u;
};

typedef struct spn_toml_chunk spn_toml_chunk_t;

struct spn_toml_doc {
  char *name;
  spn_toml_node_t *root;
  spn_toml_chunk_t *chunks;
  spn_toml_node_t **containers; /* every table and array, for free() */
  size_t ncontainers, capcontainers;
};

#endif
