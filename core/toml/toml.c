/* toml.c — TOML 1.0.0 parser.
 *
 * One pass over the bytes, after a first pass that rejects invalid UTF-8 and
 * every control character TOML forbids (all of them are forbidden everywhere
 * except tab, LF and CR LF, so the grammar below never sees one). The parser
 * is hand-written recursive descent; the only recursion is into inline arrays
 * and inline tables, and it is cut at SPN_TOML_MAX_DEPTH levels of nesting,
 * so hostile input gives an error, never a stack overflow. Tables index their
 * keys with a hash once they hold more than a handful, so the whole parse is
 * linear in the input.
 *
 * Redefinition rules (TOML 1.0.0, as toml-test reads them) are enforced with
 * the table flags in toml-internal.h:
 *   - [a] may define a table once; a table made implicitly as the parent of a
 *     header ([a.b] makes a) may be defined by its own header later, once.
 *   - a table made by dotted keys (a.b = 1 makes a) can be extended by more
 *     dotted keys, and headers may go through it to a new sub-table, but it
 *     cannot itself be named by a header.
 *   - dotted keys cannot go into a table made by a header, nor into an
 *     inline table, nor into any array.
 *   - inline tables and static arrays are frozen: no header and no dotted
 *     key may add to them.
 *   - [[a]] appends to an array made by [[a]] only, never a static array.
 * Errors say "name:line:col: reason", columns in bytes from 1 (a leading
 * BOM is not counted).
 */
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toml-internal.h"

/* ---- arena and containers ------------------------------------------------ */

struct spn_toml_chunk {
  spn_toml_chunk_t *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

#define CHUNK_SIZE (64 * 1024)

static void *arena_alloc(spn_toml_doc_t *d, size_t n) {
  n = (n + 15) & ~(size_t)15;
  spn_toml_chunk_t *c = d->chunks;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK_SIZE / 4 ? n : CHUNK_SIZE;
    spn_toml_chunk_t *nc = malloc(sizeof *nc + cap);
    if (!nc)
      return NULL;
    nc->used = 0;
    nc->cap = cap;
    if (cap == n && c) {
      /* A big one-off block: keep the current chunk for small ones. */
      nc->next = c->next;
      c->next = nc;
      nc->used = n;
      return nc->data;
    }
    nc->next = c;
    d->chunks = nc;
    c = nc;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}

static bool grow(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return true;
  size_t nc = *cap ? *cap * 2 : 4;
  while (nc < need)
    nc *= 2;
  void *nb = realloc(*buf, nc * elem);
  if (!nb)
    return false;
  *buf = nb;
  *cap = nc;
  return true;
}

static spn_toml_node_t *node_new(spn_toml_doc_t *d, spn_toml_type_t type, spn_toml_pos_t pos, uint16_t depth) {
  spn_toml_node_t *n = arena_alloc(d, sizeof *n);
  if (!n)
    return NULL;
  memset(n, 0, sizeof *n);
  n->type = type;
  n->pos = pos;
  n->depth = depth;
  n->doc = d;
  if (type == SPN_TOML_TABLE || type == SPN_TOML_ARRAY) {
    if (!grow((void **)&d->containers, &d->capcontainers, d->ncontainers + 1, sizeof *d->containers))
      return NULL;
    d->containers[d->ncontainers++] = n;
  }
  return n;
}

void spn_toml_doc_free(spn_toml_doc_t **doc) {
  if (!doc || !*doc)
    return;
  spn_toml_doc_t *d = *doc;
  for (size_t i = 0; i < d->ncontainers; i++) {
    spn_toml_node_t *n = d->containers[i];
    if (n->type == SPN_TOML_TABLE) {
      free(n->u.tab.ents);
      free(n->u.tab.slots);
    } else {
      free(n->u.arr.items);
    }
  }
  free(d->containers);
  for (spn_toml_chunk_t *c = d->chunks, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  free(d->name);
  free(d);
  *doc = NULL;
}

/* ---- tables ---------------------------------------------------------------- */

static uint32_t key_hash(const char *k, size_t n) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)k[i];
    h *= 16777619u;
  }
  return h;
}

/* Index of key in t, or -1. */
static ptrdiff_t table_find(const spn_toml_node_t *t, const char *k, size_t n) {
  uint32_t h = key_hash(k, n);
  if (t->u.tab.nslots) {
    size_t mask = t->u.tab.nslots - 1;
    for (size_t s = h & mask;; s = (s + 1) & mask) {
      uint32_t v = t->u.tab.slots[s];
      if (!v)
        return -1;
      const spn_toml_entry_t *e = &t->u.tab.ents[v - 1];
      if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0)
        return (ptrdiff_t)(v - 1);
    }
  }
  for (size_t i = 0; i < t->u.tab.len; i++) {
    const spn_toml_entry_t *e = &t->u.tab.ents[i];
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0)
      return (ptrdiff_t)i;
  }
  return -1;
}

static void slot_put(uint32_t *slots, size_t nslots, uint32_t h, uint32_t idx1) {
  size_t mask = nslots - 1;
  size_t s = h & mask;
  while (slots[s])
    s = (s + 1) & mask;
  slots[s] = idx1;
}

static bool table_add(spn_toml_node_t *t, const char *k, size_t n, spn_toml_pos_t kpos, spn_toml_node_t *v) {
  if (t->u.tab.len >= UINT32_MAX - 1)
    return false;
  if (!grow((void **)&t->u.tab.ents, &t->u.tab.cap, t->u.tab.len + 1, sizeof *t->u.tab.ents))
    return false;
  size_t idx = t->u.tab.len;
  spn_toml_entry_t *e = &t->u.tab.ents[idx];
  e->key = k;
  e->klen = n;
  e->kpos = kpos;
  e->hash = key_hash(k, n);
  e->val = v;
  t->u.tab.len++;
  if (t->u.tab.len >= 8 && t->u.tab.len * 2 > t->u.tab.nslots) {
    size_t ns = t->u.tab.nslots ? t->u.tab.nslots * 2 : 32;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (!slots)
      return false;
    for (size_t i = 0; i < t->u.tab.len; i++)
      slot_put(slots, ns, t->u.tab.ents[i].hash, (uint32_t)i + 1);
    free(t->u.tab.slots);
    t->u.tab.slots = slots;
    t->u.tab.nslots = ns;
  } else if (t->u.tab.nslots) {
    slot_put(t->u.tab.slots, t->u.tab.nslots, e->hash, (uint32_t)idx + 1);
  }
  return true;
}

static bool array_push(spn_toml_node_t *a, spn_toml_node_t *v) {
  if (!grow((void **)&a->u.arr.items, &a->u.arr.cap, a->u.arr.len + 1, sizeof *a->u.arr.items))
    return false;
  a->u.arr.items[a->u.arr.len++] = v;
  return true;
}

/* ---- parser state and errors ---------------------------------------------- */

typedef struct keyseg {
  const char *s; /* arena */
  size_t len;
  spn_toml_pos_t pos;
} keyseg_t;

typedef struct parser {
  const char *src;
  size_t len, p;
  uint32_t line;
  size_t line_start;
  spn_toml_doc_t *doc;
  spn_error_t *err;
  char *buf; /* scratch for string bodies */
  size_t blen, bcap;
  keyseg_t *segs;
  size_t nsegs, capsegs;
  locale_t c_locale; /* made on the first float: strtod must not follow LC_NUMERIC */
} parser_t;

static spn_toml_pos_t here(const parser_t *P) {
  spn_toml_pos_t pos = {P->line, (uint32_t)(P->p - P->line_start + 1)};
  return pos;
}

static int32_t fail(parser_t *P, spn_toml_pos_t pos, const char *fmt, ...) SPN_PRINTF(3, 4);
static int32_t fail(parser_t *P, spn_toml_pos_t pos, const char *fmt, ...) {
  char why[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return spn_error_set(P->err, SPN_EPARSE, "%s:%u:%u: %s", P->doc->name, pos.line, pos.col, why);
}

static int32_t oom(parser_t *P) {
  return spn_error_set(P->err, SPN_ENOMEM, "%s: out of memory", P->doc->name);
}

/* Quote a key for a message: printable bytes as they are, the rest escaped,
 * long keys cut short. */
static const char *quote_key(char *out, size_t size, const char *k, size_t n) {
  size_t o = 0;
  out[o++] = '"';
  /* Room kept at the end: one escape (6) + "..." (3) + quote + NUL. */
  for (size_t i = 0; i < n && o + 12 < size; i++) {
    unsigned char c = (unsigned char)k[i];
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20 || c == 0x7f) {
      o += (size_t)snprintf(out + o, size - o, "\\u%04x", c);
    } else {
      out[o++] = (char)c;
    }
    if (o + 12 >= size && i + 1 < n) {
      memcpy(out + o, "...", 3);
      o += 3;
      break;
    }
  }
  out[o++] = '"';
  out[o] = '\0';
  return out;
}

/* What is at the cursor, for "expected X, found Y". */
static const char *found(const parser_t *P, char *buf, size_t size) {
  if (P->p >= P->len)
    return "end of input";
  unsigned char c = (unsigned char)P->src[P->p];
  if (c == '\n' || c == '\r')
    return "end of line";
  if (c >= 0x21 && c < 0x7f)
    snprintf(buf, size, "'%c'", c);
  else if (c == ' ' || c == '\t')
    return "whitespace";
  else
    snprintf(buf, size, "byte 0x%02x", c);
  return buf;
}

static inline int cur(const parser_t *P) { return P->p < P->len ? (unsigned char)P->src[P->p] : -1; }
static inline int peek(const parser_t *P, size_t k) {
  return P->p + k < P->len ? (unsigned char)P->src[P->p + k] : -1;
}
static inline void adv(parser_t *P) {
  if (P->src[P->p] == '\n') {
    P->line++;
    P->line_start = P->p + 1;
  }
  P->p++;
}
static inline bool at_newline(const parser_t *P) {
  int c = cur(P);
  return c == '\n' || (c == '\r' && peek(P, 1) == '\n');
}
static inline void eat_newline(parser_t *P) {
  if (cur(P) == '\r')
    P->p++;
  adv(P);
}
static inline void skip_ws(parser_t *P) {
  while (P->p < P->len && (P->src[P->p] == ' ' || P->src[P->p] == '\t'))
    P->p++;
}
static void skip_comment(parser_t *P) {
  if (cur(P) != '#')
    return;
  while (P->p < P->len && !at_newline(P))
    P->p++;
}
/* Whitespace, comments and newlines (inside arrays). */
static void skip_ws_nl(parser_t *P) {
  for (;;) {
    skip_ws(P);
    skip_comment(P);
    if (at_newline(P))
      eat_newline(P);
    else
      return;
  }
}

static bool buf_put(parser_t *P, const char *s, size_t n) {
  if (!grow((void **)&P->buf, &P->bcap, P->blen + n + 1, 1))
    return false;
  memcpy(P->buf + P->blen, s, n);
  P->blen += n;
  return true;
}
static bool buf_putc(parser_t *P, char c) {
  if (P->blen + 1 >= P->bcap && !grow((void **)&P->buf, &P->bcap, P->blen + 2, 1))
    return false;
  P->buf[P->blen++] = c;
  return true;
}
/* Copy the scratch buffer into the arena, NUL-terminated. */
static char *buf_keep(parser_t *P) {
  char *s = arena_alloc(P->doc, P->blen + 1);
  if (!s)
    return NULL;
  if (P->blen)
    memcpy(s, P->buf, P->blen);
  s[P->blen] = '\0';
  return s;
}

/* ---- the first pass: UTF-8 and control characters ------------------------ */

static int32_t check_bytes(parser_t *P, size_t start) {
  const unsigned char *s = (const unsigned char *)P->src;
  size_t n = P->len;
  uint32_t line = 1;
  size_t ls = start;
  for (size_t i = start; i < n;) {
    unsigned char c = s[i];
    if (c >= 0x20 && c < 0x7f) {
      i++;
      continue;
    }
    spn_toml_pos_t pos = {line, (uint32_t)(i - ls + 1)};
    if (c == '\n') {
      line++;
      ls = ++i;
      continue;
    }
    if (c == '\t') {
      i++;
      continue;
    }
    if (c == '\r') {
      if (i + 1 < n && s[i + 1] == '\n') {
        i++;
        continue;
      }
      return fail(P, pos, "carriage return not followed by a line feed");
    }
    if (c < 0x20 || c == 0x7f)
      return fail(P, pos, "control character U+%04X is not allowed", c);
    /* Multi-byte UTF-8: reject overlong forms, surrogates, > U+10FFFF. */
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
      need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c == 0xe0)
        lo = 0xa0;
      else if (c == 0xed)
        hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c == 0xf0)
        lo = 0x90;
      else if (c == 0xf4)
        hi = 0x8f;
    } else
      return fail(P, pos, "invalid UTF-8 (byte 0x%02x)", c);
    if (n - i - 1 < need)
      return fail(P, pos, "invalid UTF-8 (truncated sequence)");
    if (s[i + 1] < lo || s[i + 1] > hi)
      return fail(P, pos, "invalid UTF-8 (byte 0x%02x after 0x%02x)", s[i + 1], c);
    for (size_t k = 2; k <= need; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf)
        return fail(P, pos, "invalid UTF-8 (byte 0x%02x in sequence)", s[i + k]);
    i += need + 1;
  }
  return SPN_OK;
}

/* ---- strings ----------------------------------------------------------------- */

static bool put_utf8(parser_t *P, uint32_t cp) {
  char b[4];
  size_t n;
  if (cp < 0x80) {
    b[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    b[0] = (char)(0xc0 | (cp >> 6));
    b[1] = (char)(0x80 | (cp & 0x3f));
    n = 2;
  } else if (cp < 0x10000) {
    b[0] = (char)(0xe0 | (cp >> 12));
    b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[2] = (char)(0x80 | (cp & 0x3f));
    n = 3;
  } else {
    b[0] = (char)(0xf0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    b[3] = (char)(0x80 | (cp & 0x3f));
    n = 4;
  }
  return buf_put(P, b, n);
}

static int hexval(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* At a backslash inside a basic string (not a line-ending one). */
static int32_t parse_escape(parser_t *P) {
  spn_toml_pos_t pos = here(P);
  P->p++; /* backslash */
  int c = cur(P);
  char out;
  switch (c) {
  case 'b': out = '\b'; break;
  case 't': out = '\t'; break;
  case 'n': out = '\n'; break;
  case 'f': out = '\f'; break;
  case 'r': out = '\r'; break;
  case '"': out = '"'; break;
  case '\\': out = '\\'; break;
  case 'u':
  case 'U': {
    int nd = c == 'u' ? 4 : 8;
    uint32_t cp = 0;
    P->p++;
    for (int i = 0; i < nd; i++) {
      int h = hexval(cur(P));
      if (h < 0)
        return fail(P, pos, "\\%c escape needs %d hex digits", c, nd);
      cp = cp << 4 | (uint32_t)h;
      P->p++;
    }
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return fail(P, pos, "\\%c%0*X is not a Unicode scalar value", c, nd, cp);
    return put_utf8(P, cp) ? SPN_OK : oom(P);
  }
  default:
    if (c >= 0x21 && c < 0x7f)
      return fail(P, pos, "invalid escape \\%c", c);
    return fail(P, pos, "invalid escape sequence");
  }
  P->p++;
  return buf_putc(P, out) ? SPN_OK : oom(P);
}

/* Single-line basic ("...") or literal ('...') string at the cursor; the body
 * ends up in P->buf. */
static int32_t parse_line_string(parser_t *P) {
  spn_toml_pos_t start = here(P);
  char q = P->src[P->p];
  P->p++;
  P->blen = 0;
  for (;;) {
    int c = cur(P);
    if (c < 0)
      return fail(P, start, "unterminated string");
    if (c == '\n' || c == '\r')
      return fail(P, here(P), "newline in a single-line string");
    if (c == q) {
      P->p++;
      return SPN_OK;
    }
    if (c == '\\' && q == '"') {
      int32_t rc = parse_escape(P);
      if (rc < 0)
        return rc;
      continue;
    }
    /* Copy a run of ordinary bytes at once. */
    size_t s = P->p;
    while (P->p < P->len) {
      char d = P->src[P->p];
      if (d == q || d == '\n' || d == '\r' || (d == '\\' && q == '"'))
        break;
      P->p++;
    }
    if (!buf_put(P, P->src + s, P->p - s))
      return oom(P);
  }
}

/* Multi-line string; the cursor is on the opening triple quote. */
static int32_t parse_ml_string(parser_t *P) {
  spn_toml_pos_t start = here(P);
  char q = P->src[P->p];
  P->p += 3;
  P->blen = 0;
  if (at_newline(P))
    eat_newline(P); /* a newline right after the opening quotes is trimmed */
  for (;;) {
    int c = cur(P);
    if (c < 0)
      return fail(P, start, "unterminated multi-line string");
    if (c == q) {
      size_t k = 0;
      while (peek(P, k) == q)
        k++;
      if (k >= 3) {
        /* Up to two quotes may sit just before the closing delimiter. */
        if (k > 5)
          return fail(P, here(P), "too many quotes at the end of a multi-line string");
        for (size_t i = 0; i < k - 3; i++)
          if (!buf_putc(P, q))
            return oom(P);
        P->p += k;
        return SPN_OK;
      }
      for (size_t i = 0; i < k; i++)
        if (!buf_putc(P, q))
          return oom(P);
      P->p += k;
      continue;
    }
    if (c == '\\' && q == '"') {
      /* Line-ending backslash: backslash, optional blanks, newline; then all
       * whitespace and newlines up to the next visible character go. */
      size_t k = 1;
      while (peek(P, k) == ' ' || peek(P, k) == '\t')
        k++;
      int e = peek(P, k);
      if (e == '\n' || (e == '\r' && peek(P, k + 1) == '\n')) {
        P->p += k;
        while (P->p < P->len) {
          int d = cur(P);
          if (d == ' ' || d == '\t')
            P->p++;
          else if (at_newline(P))
            eat_newline(P);
          else
            break;
        }
        continue;
      }
      if (k > 1)
        return fail(P, here(P), "backslash followed by whitespace must end the line");
      int32_t rc = parse_escape(P);
      if (rc < 0)
        return rc;
      continue;
    }
    if (at_newline(P)) {
      /* CR LF is read as LF so values do not depend on the file's line ends. */
      eat_newline(P);
      if (!buf_putc(P, '\n'))
        return oom(P);
      continue;
    }
    size_t s = P->p;
    while (P->p < P->len) {
      char d = P->src[P->p];
      if (d == q || d == '\n' || d == '\r' || (d == '\\' && q == '"'))
        break;
      P->p++;
    }
    if (!buf_put(P, P->src + s, P->p - s))
      return oom(P);
  }
}

/* ---- keys --------------------------------------------------------------------- */

static bool is_bare(int c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* A dotted key into P->segs. */
static int32_t parse_key(parser_t *P) {
  P->nsegs = 0;
  for (;;) {
    keyseg_t seg;
    seg.pos = here(P);
    int c = cur(P);
    if (c == '"' || c == '\'') {
      if (peek(P, 1) == c && peek(P, 2) == c)
        return fail(P, seg.pos, "a key cannot be a multi-line string");
      int32_t rc = parse_line_string(P);
      if (rc < 0)
        return rc;
    } else if (is_bare(c)) {
      size_t s = P->p;
      while (is_bare(cur(P)))
        P->p++;
      P->blen = 0;
      if (!buf_put(P, P->src + s, P->p - s))
        return oom(P);
    } else {
      char fb[16];
      return fail(P, seg.pos, "expected a key, found %s", found(P, fb, sizeof fb));
    }
    seg.s = buf_keep(P);
    seg.len = P->blen;
    if (!seg.s || !grow((void **)&P->segs, &P->capsegs, P->nsegs + 1, sizeof *P->segs))
      return oom(P);
    P->segs[P->nsegs++] = seg;
    skip_ws(P);
    if (cur(P) != '.')
      return SPN_OK;
    P->p++;
    skip_ws(P);
  }
}

/* ---- numbers and dates -------------------------------------------------------- */

/* Digits (per `ok`) with single underscores between them, from s[*i]. */
static bool scan_digits(const char *s, size_t n, size_t *i, int (*ok)(int)) {
  size_t j = *i;
  if (j >= n || !ok((unsigned char)s[j]))
    return false;
  while (j < n) {
    if (ok((unsigned char)s[j]))
      j++;
    else if (s[j] == '_' && j + 1 < n && ok((unsigned char)s[j + 1]))
      j++;
    else
      break;
  }
  *i = j;
  return true;
}
static int is_dec(int c) { return c >= '0' && c <= '9'; }
static int is_hex(int c) { return hexval(c) >= 0; }
static int is_oct(int c) { return c >= '0' && c <= '7'; }
static int is_bin(int c) { return c == '0' || c == '1'; }

static int32_t parse_number(parser_t *P, spn_toml_node_t *v) {
  spn_toml_pos_t pos = here(P);
  size_t s0 = P->p;
  while (P->p < P->len) {
    int c = cur(P);
    if (is_bare(c) || c == '+' || c == '.')
      P->p++;
    else
      break;
  }
  const char *s = P->src + s0;
  size_t n = P->p - s0;
  size_t i = 0;
  bool neg = false, sign = false;
  if (n && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    sign = true;
    i = 1;
  }
  if (n - i == 3 && (memcmp(s + i, "inf", 3) == 0 || memcmp(s + i, "nan", 3) == 0)) {
    v->type = SPN_TOML_FLOAT;
    if (s[i] == 'i')
      v->u.f = neg ? -INFINITY : INFINITY;
    else
      v->u.f = neg ? -NAN : NAN;
    return SPN_OK;
  }
  if (n - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'o' || s[i + 1] == 'b')) {
    if (sign)
      return fail(P, pos, "hexadecimal, octal and binary integers cannot have a sign");
    int base = s[i + 1] == 'x' ? 16 : s[i + 1] == 'o' ? 8 : 2;
    int (*ok)(int) = base == 16 ? is_hex : base == 8 ? is_oct : is_bin;
    size_t j = i + 2;
    if (!scan_digits(s, n, &j, ok) || j != n)
      return fail(P, pos, "invalid %s integer", base == 16 ? "hexadecimal" : base == 8 ? "octal" : "binary");
    uint64_t acc = 0;
    for (size_t k = i + 2; k < n; k++) {
      if (s[k] == '_')
        continue;
      uint64_t d = (uint64_t)hexval((unsigned char)s[k]);
      if (acc > ((uint64_t)INT64_MAX - d) / (uint64_t)base)
        return fail(P, pos, "integer does not fit in 64 bits");
      acc = acc * (uint64_t)base + d;
    }
    v->type = SPN_TOML_INTEGER;
    v->u.i = (int64_t)acc;
    return SPN_OK;
  }
  size_t ib = i;
  if (!scan_digits(s, n, &i, is_dec))
    return fail(P, pos, "invalid number");
  if (s[ib] == '0' && i - ib > 1)
    return fail(P, pos, "leading zeros are not allowed");
  bool is_float = false;
  if (i < n && s[i] == '.') {
    i++;
    if (!scan_digits(s, n, &i, is_dec))
      return fail(P, pos, "a decimal point must be followed by digits");
    is_float = true;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      i++;
    if (!scan_digits(s, n, &i, is_dec))
      return fail(P, pos, "an exponent needs digits");
    is_float = true;
  }
  if (i != n)
    return fail(P, pos, "invalid number");
  if (is_float) {
    P->blen = 0;
    for (size_t k = 0; k < n; k++)
      if (s[k] != '_' && !buf_putc(P, s[k]))
        return oom(P);
    if (!buf_putc(P, '\0'))
      return oom(P);
    if (!P->c_locale && !(P->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0)))
      return oom(P);
    v->type = SPN_TOML_FLOAT;
    v->u.f = strtod_l(P->buf, NULL, P->c_locale);
    return SPN_OK;
  }
  uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (size_t k = ib; k < n; k++) {
    if (s[k] == '_')
      continue;
    uint64_t d = (uint64_t)(s[k] - '0');
    if (acc > (lim - d) / 10)
      return fail(P, pos, "integer does not fit in 64 bits");
    acc = acc * 10 + d;
  }
  v->type = SPN_TOML_INTEGER;
  v->u.i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
  return SPN_OK;
}

/* n decimal digits at the cursor, or -1. */
static int32_t digits(parser_t *P, int n) {
  int32_t v = 0;
  for (int i = 0; i < n; i++) {
    int c = peek(P, (size_t)i);
    if (!is_dec(c))
      return -1;
    v = v * 10 + (c - '0');
  }
  P->p += (size_t)n;
  return v;
}

static bool expect_char(parser_t *P, char c) {
  if (cur(P) != c)
    return false;
  P->p++;
  return true;
}

static int32_t parse_time(parser_t *P, spn_toml_datetime_t *dt, spn_toml_pos_t pos) {
  dt->hour = digits(P, 2);
  if (dt->hour < 0 || !expect_char(P, ':'))
    return fail(P, pos, "invalid time (want HH:MM:SS)");
  dt->minute = digits(P, 2);
  if (dt->minute < 0 || !expect_char(P, ':'))
    return fail(P, pos, "invalid time (want HH:MM:SS)");
  dt->second = digits(P, 2);
  if (dt->second < 0)
    return fail(P, pos, "invalid time (want HH:MM:SS)");
  if (dt->hour > 23 || dt->minute > 59 || dt->second > 60)
    return fail(P, pos, "time out of range");
  if (cur(P) == '.') {
    P->p++;
    if (!is_dec(cur(P)))
      return fail(P, here(P), "fractional seconds need digits");
    int32_t ns = 0;
    int nd = 0;
    while (is_dec(cur(P))) {
      if (nd < 9) {
        ns = ns * 10 + (cur(P) - '0');
        nd++;
      }
      P->p++;
    }
    while (nd++ < 9)
      ns *= 10;
    dt->nanosecond = ns;
  }
  return SPN_OK;
}

static int32_t parse_datetime(parser_t *P, spn_toml_node_t *v, bool time_only) {
  spn_toml_pos_t pos = v->pos;
  spn_toml_datetime_t *dt = &v->u.dt;
  if (time_only) {
    v->type = SPN_TOML_TIME_LOCAL;
    return parse_time(P, dt, pos);
  }
  dt->year = digits(P, 4);
  if (dt->year < 0 || !expect_char(P, '-'))
    return fail(P, pos, "invalid date (want YYYY-MM-DD)");
  dt->month = digits(P, 2);
  if (dt->month < 0 || !expect_char(P, '-'))
    return fail(P, pos, "invalid date (want YYYY-MM-DD)");
  dt->day = digits(P, 2);
  if (dt->day < 0)
    return fail(P, pos, "invalid date (want YYYY-MM-DD)");
  static const int8_t mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (dt->month < 1 || dt->month > 12 || dt->day < 1 || dt->day > mdays[dt->month - 1])
    return fail(P, pos, "date out of range");
  if (dt->month == 2 && dt->day == 29) {
    int y = dt->year;
    if (!(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)))
      return fail(P, pos, "February 29 in a year that is not a leap year");
  }
  int c = cur(P);
  if (!(c == 'T' || c == 't' || (c == ' ' && is_dec(peek(P, 1))))) {
    v->type = SPN_TOML_DATE_LOCAL;
    return SPN_OK;
  }
  P->p++;
  int32_t rc = parse_time(P, dt, pos);
  if (rc < 0)
    return rc;
  c = cur(P);
  if (c == 'Z' || c == 'z') {
    P->p++;
    v->type = SPN_TOML_DATETIME;
    return SPN_OK;
  }
  if (c == '+' || c == '-') {
    P->p++;
    int32_t oh = digits(P, 2);
    if (oh < 0 || !expect_char(P, ':'))
      return fail(P, pos, "invalid time offset (want +HH:MM)");
    int32_t om = digits(P, 2);
    if (om < 0)
      return fail(P, pos, "invalid time offset (want +HH:MM)");
    if (oh > 23 || om > 59)
      return fail(P, pos, "time offset out of range");
    dt->offset_minutes = (c == '-' ? -1 : 1) * (oh * 60 + om);
    v->type = SPN_TOML_DATETIME;
    return SPN_OK;
  }
  v->type = SPN_TOML_DATETIME_LOCAL;
  return SPN_OK;
}

/* ---- values --------------------------------------------------------------------- */

static int32_t parse_value(parser_t *P, uint16_t depth, spn_toml_node_t **out);
static int32_t parse_keyval(parser_t *P, spn_toml_node_t *table);

static int32_t too_deep(parser_t *P, spn_toml_pos_t pos) {
  return fail(P, pos, "nesting deeper than %d levels", SPN_TOML_MAX_DEPTH);
}

/* A key segment names no entry of *t yet: create the table it implies
 * (flags say how: by a dotted key, or by a [header] above it), one level
 * deeper, and descend into it. */
static int32_t add_subtable(parser_t *P, spn_toml_node_t **t, const keyseg_t *sg, uint16_t flags) {
  if ((*t)->depth + 1 > SPN_TOML_MAX_DEPTH)
    return too_deep(P, sg->pos);
  spn_toml_node_t *nt = node_new(P->doc, SPN_TOML_TABLE, sg->pos, (uint16_t)((*t)->depth + 1));
  if (!nt || !table_add(*t, sg->s, sg->len, sg->pos, nt))
    return oom(P);
  nt->flags = flags;
  *t = nt;
  return SPN_OK;
}

static int32_t parse_array(parser_t *P, spn_toml_node_t *a) {
  char fb[16];
  P->p++; /* [ */
  for (;;) {
    skip_ws_nl(P);
    if (cur(P) == ']')
      break;
    if (cur(P) < 0)
      return fail(P, here(P), "unterminated array (opened at %u:%u)", a->pos.line, a->pos.col);
    spn_toml_node_t *item;
    int32_t rc = parse_value(P, (uint16_t)(a->depth + 1), &item);
    if (rc < 0)
      return rc;
    if (!array_push(a, item))
      return oom(P);
    skip_ws_nl(P);
    if (cur(P) == ',') {
      P->p++;
      continue;
    }
    if (cur(P) == ']')
      break;
    if (cur(P) < 0)
      return fail(P, here(P), "unterminated array (opened at %u:%u)", a->pos.line, a->pos.col);
    return fail(P, here(P), "expected ',' or ']' in array, found %s", found(P, fb, sizeof fb));
  }
  P->p++; /* ] */
  return SPN_OK;
}

static int32_t parse_inline_table(parser_t *P, spn_toml_node_t *t) {
  char fb[16];
  P->p++; /* { */
  skip_ws(P);
  if (cur(P) == '}') {
    P->p++;
    t->flags |= SPN_TOML_F_INLINE;
    return SPN_OK;
  }
  for (;;) {
    skip_ws(P);
    if (cur(P) == '}')
      return fail(P, here(P), "trailing comma in inline table");
    if (at_newline(P))
      return fail(P, here(P), "newline in inline table");
    int32_t rc = parse_keyval(P, t);
    if (rc < 0)
      return rc;
    skip_ws(P);
    if (cur(P) == ',') {
      P->p++;
      continue;
    }
    if (cur(P) == '}')
      break;
    if (at_newline(P))
      return fail(P, here(P), "newline in inline table");
    if (cur(P) < 0)
      return fail(P, here(P), "unterminated inline table (opened at %u:%u)", t->pos.line, t->pos.col);
    return fail(P, here(P), "expected ',' or '}' in inline table, found %s", found(P, fb, sizeof fb));
  }
  P->p++;
  t->flags |= SPN_TOML_F_INLINE;
  return SPN_OK;
}

static bool word_at(const parser_t *P, const char *w, size_t n) {
  return P->len - P->p >= n && memcmp(P->src + P->p, w, n) == 0;
}

static int32_t parse_value(parser_t *P, uint16_t depth, spn_toml_node_t **out) {
  char fb[16];
  spn_toml_pos_t pos = here(P);
  int c = cur(P);
  spn_toml_type_t type = SPN_TOML_STRING;
  if (c == '[')
    type = SPN_TOML_ARRAY;
  else if (c == '{')
    type = SPN_TOML_TABLE;
  if ((type == SPN_TOML_ARRAY || type == SPN_TOML_TABLE) && depth > SPN_TOML_MAX_DEPTH)
    return too_deep(P, pos);
  spn_toml_node_t *v = node_new(P->doc, type, pos, depth);
  if (!v)
    return oom(P);
  *out = v;
  switch (c) {
  case '[':
    return parse_array(P, v);
  case '{':
    return parse_inline_table(P, v);
  case '"':
  case '\'': {
    int32_t rc = (peek(P, 1) == c && peek(P, 2) == c) ? parse_ml_string(P) : parse_line_string(P);
    if (rc < 0)
      return rc;
    v->u.str.s = buf_keep(P);
    v->u.str.len = P->blen;
    return v->u.str.s ? SPN_OK : oom(P);
  }
  case 't':
  case 'f':
    v->type = SPN_TOML_BOOL;
    if (word_at(P, "true", 4) && !is_bare(peek(P, 4))) {
      P->p += 4;
      v->u.b = true;
      return SPN_OK;
    }
    if (word_at(P, "false", 5) && !is_bare(peek(P, 5))) {
      P->p += 5;
      v->u.b = false;
      return SPN_OK;
    }
    return fail(P, pos, "invalid value (booleans are true and false, in lower case)");
  default:
    break;
  }
  if (is_dec(c)) {
    if (is_dec(peek(P, 1)) && is_dec(peek(P, 2)) && is_dec(peek(P, 3)) && peek(P, 4) == '-')
      return parse_datetime(P, v, false);
    if (is_dec(peek(P, 1)) && peek(P, 2) == ':')
      return parse_datetime(P, v, true);
  }
  if (is_dec(c) || c == '+' || c == '-' || c == 'i' || c == 'n')
    return parse_number(P, v);
  if (c < 0 || at_newline(P))
    return fail(P, pos, "expected a value, found %s", found(P, fb, sizeof fb));
  return fail(P, pos, "expected a value, found %s", found(P, fb, sizeof fb));
}

static const char *describe(const spn_toml_node_t *n) {
  if (n->type == SPN_TOML_TABLE)
    return (n->flags & SPN_TOML_F_INLINE) ? "an inline table" : "a table";
  if (n->type == SPN_TOML_ARRAY)
    return (n->flags & SPN_TOML_F_AOT) ? "an array of tables" : "an array";
  return spn_toml_type_name(n->type);
}

/* key = value, into `table` (the current section or an inline table). */
static int32_t parse_keyval(parser_t *P, spn_toml_node_t *table) {
  char fb[16], kq[96];
  int32_t rc = parse_key(P);
  if (rc < 0)
    return rc;
  if (cur(P) != '=')
    return fail(P, here(P), "expected '=' after a key, found %s", found(P, fb, sizeof fb));
  P->p++;
  skip_ws(P);
  spn_toml_node_t *t = table;
  for (size_t i = 0; i + 1 < P->nsegs; i++) {
    keyseg_t *sg = &P->segs[i];
    ptrdiff_t at = table_find(t, sg->s, sg->len);
    if (at < 0) {
      int32_t sub_rc = add_subtable(P, &t, sg, SPN_TOML_F_DOTTED);
      if (sub_rc)
        return sub_rc;
      continue;
    }
    spn_toml_node_t *v = t->u.tab.ents[at].val;
    if (v->type != SPN_TOML_TABLE || !(v->flags & SPN_TOML_F_DOTTED) || (v->flags & SPN_TOML_F_INLINE)) {
      spn_toml_pos_t dp = t->u.tab.ents[at].kpos;
      return fail(P, sg->pos, "cannot add to key %s with dotted keys: it is %s (defined at %u:%u)",
                  quote_key(kq, sizeof kq, sg->s, sg->len), describe(v), dp.line, dp.col);
    }
    t = v;
  }
  keyseg_t last = P->segs[P->nsegs - 1];
  ptrdiff_t at = table_find(t, last.s, last.len);
  if (at >= 0) {
    spn_toml_pos_t dp = t->u.tab.ents[at].kpos;
    return fail(P, last.pos, "duplicate key %s (first defined at %u:%u)", quote_key(kq, sizeof kq, last.s, last.len),
                dp.line, dp.col);
  }
  spn_toml_node_t *v;
  rc = parse_value(P, (uint16_t)(t->depth + 1), &v);
  if (rc < 0)
    return rc;
  if (!table_add(t, last.s, last.len, last.pos, v))
    return oom(P);
  return SPN_OK;
}

/* [a.b.c] or [[a.b.c]]; returns the new current section in *section. */
static int32_t parse_header(parser_t *P, spn_toml_node_t **section) {
  char fb[16], kq[96];
  spn_toml_pos_t hpos = here(P);
  bool aot = peek(P, 1) == '[';
  P->p += aot ? 2 : 1;
  skip_ws(P);
  int32_t rc = parse_key(P);
  if (rc < 0)
    return rc;
  if (cur(P) != ']' || (aot && peek(P, 1) != ']'))
    return fail(P, here(P), "expected '%s' to close the table header, found %s", aot ? "]]" : "]",
                found(P, fb, sizeof fb));
  P->p += aot ? 2 : 1;
  spn_toml_node_t *t = P->doc->root;
  for (size_t i = 0; i + 1 < P->nsegs; i++) {
    keyseg_t *sg = &P->segs[i];
    ptrdiff_t at = table_find(t, sg->s, sg->len);
    if (at < 0) {
      int32_t sub_rc = add_subtable(P, &t, sg, SPN_TOML_F_IMPLICIT);
      if (sub_rc)
        return sub_rc;
      continue;
    }
    spn_toml_node_t *v = t->u.tab.ents[at].val;
    if (v->type == SPN_TOML_TABLE && !(v->flags & SPN_TOML_F_INLINE)) {
      t = v;
    } else if (v->type == SPN_TOML_ARRAY && (v->flags & SPN_TOML_F_AOT)) {
      t = v->u.arr.items[v->u.arr.len - 1]; /* the latest [[table]] */
    } else {
      spn_toml_pos_t dp = t->u.tab.ents[at].kpos;
      return fail(P, sg->pos, "cannot add a table to key %s: it is %s (defined at %u:%u)",
                  quote_key(kq, sizeof kq, sg->s, sg->len), describe(v), dp.line, dp.col);
    }
  }
  keyseg_t *last = &P->segs[P->nsegs - 1];
  if (t->depth + 2 > SPN_TOML_MAX_DEPTH)
    return too_deep(P, last->pos);
  ptrdiff_t at = table_find(t, last->s, last->len);
  spn_toml_node_t *v = at >= 0 ? t->u.tab.ents[at].val : NULL;
  if (!aot) {
    if (!v) {
      v = node_new(P->doc, SPN_TOML_TABLE, hpos, (uint16_t)(t->depth + 1));
      if (!v || !table_add(t, last->s, last->len, last->pos, v))
        return oom(P);
      v->flags = SPN_TOML_F_EXPLICIT;
    } else if (v->type == SPN_TOML_TABLE && v->flags == SPN_TOML_F_IMPLICIT) {
      v->flags = SPN_TOML_F_EXPLICIT;
      v->pos = hpos;
    } else {
      spn_toml_pos_t dp = t->u.tab.ents[at].kpos;
      const char *why = v->type != SPN_TOML_TABLE       ? describe(v)
                        : (v->flags & SPN_TOML_F_INLINE) ? "an inline table"
                        : (v->flags & SPN_TOML_F_DOTTED) ? "a table defined by dotted keys"
                                                         : "a table already defined";
      return fail(P, last->pos, "cannot define table %s: it is %s (at %u:%u)",
                  quote_key(kq, sizeof kq, last->s, last->len), why, dp.line, dp.col);
    }
    *section = v;
  } else {
    if (!v) {
      v = node_new(P->doc, SPN_TOML_ARRAY, hpos, (uint16_t)(t->depth + 1));
      if (!v || !table_add(t, last->s, last->len, last->pos, v))
        return oom(P);
      v->flags = SPN_TOML_F_AOT;
    } else if (!(v->type == SPN_TOML_ARRAY && (v->flags & SPN_TOML_F_AOT))) {
      spn_toml_pos_t dp = t->u.tab.ents[at].kpos;
      return fail(P, last->pos, "cannot append a table to key %s: it is %s (defined at %u:%u)",
                  quote_key(kq, sizeof kq, last->s, last->len), describe(v), dp.line, dp.col);
    }
    spn_toml_node_t *el = node_new(P->doc, SPN_TOML_TABLE, hpos, (uint16_t)(v->depth + 1));
    if (!el || !array_push(v, el))
      return oom(P);
    el->flags = SPN_TOML_F_EXPLICIT;
    *section = el;
  }
  return SPN_OK;
}

static int32_t parse_document(parser_t *P) {
  char fb[16];
  spn_toml_node_t *section = P->doc->root;
  for (;;) {
    skip_ws(P);
    int c = cur(P);
    if (c < 0)
      return SPN_OK;
    if (c == '#') {
      skip_comment(P);
    } else if (at_newline(P)) {
      eat_newline(P);
      continue;
    } else {
      int32_t rc = c == '[' ? parse_header(P, &section) : parse_keyval(P, section);
      if (rc < 0)
        return rc;
      skip_ws(P);
      skip_comment(P);
    }
    if (cur(P) < 0)
      return SPN_OK;
    if (!at_newline(P))
      return fail(P, here(P), "expected the end of the line, found %s", found(P, fb, sizeof fb));
    eat_newline(P);
  }
}

int32_t spn_toml_parse(const char *src, size_t len, const char *name, spn_toml_doc_t **out, spn_error_t *err) {
  SPN_ASSERT(out);
  *out = NULL;
  if (!name)
    name = "<toml>";
  if (!src && len)
    return spn_error_set(err, SPN_EINVAL, "%s: no input", name);
  spn_toml_doc_t *d = calloc(1, sizeof *d);
  if (!d)
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", name);
  int32_t rc = SPN_ENOMEM;
  d->name = strdup(name);
  if (!d->name)
    goto out_doc;
  parser_t P = {.src = src ? src : "", .len = len, .line = 1, .doc = d, .err = err};
  if (len >= 3 && memcmp(src, "\xef\xbb\xbf", 3) == 0)
    P.p = P.line_start = 3;
  spn_toml_pos_t origin = {1, 1};
  d->root = node_new(d, SPN_TOML_TABLE, origin, 0);
  if (!d->root) {
    rc = oom(&P);
    goto out_parser;
  }
  d->root->flags = SPN_TOML_F_EXPLICIT;
  rc = check_bytes(&P, P.p);
  if (rc < 0)
    goto out_parser;
  rc = parse_document(&P);
  if (rc < 0)
    goto out_parser;
  free(P.buf);
  free(P.segs);
  if (P.c_locale)
    freelocale(P.c_locale);
  *out = d;
  return SPN_OK;
out_parser:
  free(P.buf);
  free(P.segs);
  if (P.c_locale)
    freelocale(P.c_locale);
out_doc:
  if (rc == SPN_ENOMEM && err && err->code != SPN_ENOMEM)
    spn_error_set(err, SPN_ENOMEM, "%s: out of memory", name);
  spn_toml_doc_free(&d);
  return rc;
}

int32_t spn_toml_parse_file(const char *path, spn_toml_doc_t **out, spn_error_t *err) {
  SPN_ASSERT(path && out);
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return spn_error_set(err, e == ENOENT ? SPN_ENOENT : SPN_EIO, "%s: cannot open: %s", path, strerror(e));
  }
  int32_t rc = SPN_OK;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (!grow((void **)&buf, &cap, len + 65536, 1)) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
      goto out_file;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0)
      break;
  }
  if (ferror(f)) {
    rc = spn_error_set(err, SPN_EIO, "%s: read error", path);
    goto out_file;
  }
  rc = spn_toml_parse(buf, len, path, out, err);
out_file:
  free(buf);
  fclose(f);
  return rc;
}
