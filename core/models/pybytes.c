/* pybytes.c — decode one Python bytes literal (pybytes.h).
 *
 * The decoder never writes more bytes than the literal has characters, so
 * the output buffer is sized by the literal's length; anything not in the
 * accepted grammar is an error naming file and line, never skipped.
 */
#include "pybytes.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int line_of(const char *src, const char *p) {
  int l = 1;
  for (const char *q = src; q < p; q++)
    l += *q == '\n';
  return l;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int spn_pybytes_extract(const char *src, size_t len, const char *var, const char *file, uint8_t **out,
                        size_t *out_len, char *msg, size_t msz) {
  const char *end = src + len, *p = NULL;
  size_t vl = strlen(var);
  /* `var` at the start of a line, then optional blanks and '='. */
  for (const char *q = src; q + vl < end; q++) {
    if ((q == src || q[-1] == '\n') && !memcmp(q, var, vl)) {
      const char *r = q + vl;
      while (r < end && (*r == ' ' || *r == '\t'))
        r++;
      if (r < end && *r == '=') {
        p = r + 1;
        break;
      }
    }
  }
  if (!p) {
    snprintf(msg, msz, "%s: no assignment to %s", file, var);
    return -1;
  }
  while (p < end && (*p == ' ' || *p == '\t'))
    p++;
  if (end - p < 2 || (*p != 'b' && *p != 'B') || (p[1] != '\'' && p[1] != '"')) {
    snprintf(msg, msz, "%s:%d: %s is not a b'...' bytes literal", file, line_of(src, p), var);
    return -1;
  }
  char quote = p[1];
  p += 2;
  if (end - p >= 2 && p[0] == quote && p[1] == quote) {
    snprintf(msg, msz, "%s:%d: triple-quoted bytes literals are not supported", file, line_of(src, p));
    return -1;
  }
  uint8_t *buf = malloc((size_t)(end - p) + 1);
  if (!buf) {
    snprintf(msg, msz, "out of memory");
    return -1;
  }
  size_t n = 0;
  while (p < end && *p != quote) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '\n' || ch >= 0x80) {
      snprintf(msg, msz, "%s:%d: %s in a bytes literal", file, line_of(src, p),
               ch == '\n' ? "unterminated literal (newline)" : "non-ASCII character");
      free(buf);
      return -1;
    }
    if (ch != '\\') {
      buf[n++] = ch;
      p++;
      continue;
    }
    if (end - p < 2)
      break;
    char e = p[1];
    p += 2;
    switch (e) {
    case '\n': break;
    case '\\': buf[n++] = '\\'; break;
    case '\'': buf[n++] = '\''; break;
    case '"': buf[n++] = '"'; break;
    case 'a': buf[n++] = 7; break;
    case 'b': buf[n++] = 8; break;
    case 'f': buf[n++] = 12; break;
    case 'n': buf[n++] = 10; break;
    case 'r': buf[n++] = 13; break;
    case 't': buf[n++] = 9; break;
    case 'v': buf[n++] = 11; break;
    case 'x': {
      int h = end - p >= 2 ? hexval(p[0]) : -1, l = end - p >= 2 ? hexval(p[1]) : -1;
      if (h < 0 || l < 0) {
        snprintf(msg, msz, "%s:%d: bad \\x escape", file, line_of(src, p));
        free(buf);
        return -1;
      }
      buf[n++] = (uint8_t)(h * 16 + l);
      p += 2;
      break;
    }
    default:
      if (e >= '0' && e <= '7') {
        int v = e - '0';
        for (int k = 0; k < 2 && p < end && *p >= '0' && *p <= '7'; k++)
          v = v * 8 + (*p++ - '0');
        buf[n++] = (uint8_t)v;
      } else { /* Python keeps an unknown escape as backslash + character */
        buf[n++] = '\\';
        buf[n++] = (uint8_t)e;
      }
    }
  }
  if (p >= end) {
    snprintf(msg, msz, "%s: bytes literal %s is not terminated", file, var);
    free(buf);
    return -1;
  }
  *out = buf;
  *out_len = n;
  return 0;
}
