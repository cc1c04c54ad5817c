/* toml-decode.c — toml-test decoder: TOML on stdin, tagged JSON on stdout.
 *
 * Implements the interface of the toml-test suite: a valid document prints as
 * a JSON object whose tables are objects, arrays are arrays and every scalar
 * is {"type": "...", "value": "..."}; exit 0. Invalid TOML prints the parse
 * error (name:line:col: reason) on stderr and exits 1. The tree is at most
 * SPN_TOML_MAX_DEPTH deep, so the recursive writer below is bounded.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spindle/toml.h"

static void put_json_string(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\b': fputs("\\b", f); break;
    case '\f': fputs("\\f", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (c < 0x20 || c == 0x7f)
        fprintf(f, "\\u%04x", c);
      else
        fputc(c, f);
    }
  }
  fputc('"', f);
}

static void put_frac(char *b, size_t size, int32_t ns) {
  if (ns == 0) {
    b[0] = '\0';
    return;
  }
  snprintf(b, size, ".%09d", (int)ns);
  size_t n = strlen(b);
  while (n > 2 && b[n - 1] == '0')
    b[--n] = '\0';
}

static void put_scalar(FILE *f, const spn_toml_node_t *n) {
  char v[128], frac[16];
  spn_toml_type_t t = spn_toml_node_type(n);
  switch (t) {
  case SPN_TOML_STRING: {
    size_t len;
    const char *s = spn_toml_string(n, &len);
    fputs("{\"type\":\"string\",\"value\":", f);
    put_json_string(f, s, len);
    fputc('}', f);
    return;
  }
  case SPN_TOML_INTEGER:
    snprintf(v, sizeof v, "%" PRId64, spn_toml_int(n));
    break;
  case SPN_TOML_FLOAT: {
    double d = spn_toml_float(n);
    if (isnan(d))
      snprintf(v, sizeof v, "nan");
    else if (isinf(d))
      snprintf(v, sizeof v, "%s", d < 0 ? "-inf" : "inf");
    else
      snprintf(v, sizeof v, "%.17g", d);
    break;
  }
  case SPN_TOML_BOOL:
    snprintf(v, sizeof v, "%s", spn_toml_bool(n) ? "true" : "false");
    break;
  default: {
    spn_toml_datetime_t dt = spn_toml_datetime(n);
    put_frac(frac, sizeof frac, dt.nanosecond);
    if (t == SPN_TOML_DATE_LOCAL) {
      snprintf(v, sizeof v, "%04d-%02d-%02d", (int)dt.year, (int)dt.month, (int)dt.day);
    } else if (t == SPN_TOML_TIME_LOCAL) {
      snprintf(v, sizeof v, "%02d:%02d:%02d%s", (int)dt.hour, (int)dt.minute, (int)dt.second, frac);
    } else {
      int o = snprintf(v, sizeof v, "%04d-%02d-%02dT%02d:%02d:%02d%s", (int)dt.year, (int)dt.month, (int)dt.day,
                       (int)dt.hour, (int)dt.minute, (int)dt.second, frac);
      if (t == SPN_TOML_DATETIME) {
        int off = dt.offset_minutes;
        if (off == 0)
          snprintf(v + o, sizeof v - (size_t)o, "Z");
        else
          snprintf(v + o, sizeof v - (size_t)o, "%c%02d:%02d", off < 0 ? '-' : '+', abs(off) / 60, abs(off) % 60);
      }
    }
  }
  }
  /* toml-test calls booleans "bool". */
  fprintf(f, "{\"type\":\"%s\",\"value\":\"%s\"}", t == SPN_TOML_BOOL ? "bool" : spn_toml_type_name(t), v);
}

static void put_node(FILE *f, const spn_toml_node_t *n) {
  spn_toml_type_t t = spn_toml_node_type(n);
  if (t == SPN_TOML_TABLE) {
    fputc('{', f);
    for (size_t i = 0; i < spn_toml_table_len(n); i++) {
      if (i)
        fputc(',', f);
      const char *k = spn_toml_table_key_at(n, i, NULL);
      put_json_string(f, k, spn_toml_table_key_len(n, i)); /* may hold NUL */
      fputc(':', f);
      put_node(f, spn_toml_table_value_at(n, i));
    }
    fputc('}', f);
  } else if (t == SPN_TOML_ARRAY) {
    fputc('[', f);
    for (size_t i = 0; i < spn_toml_array_len(n); i++) {
      if (i)
        fputc(',', f);
      put_node(f, spn_toml_array_at(n, i));
    }
    fputc(']', f);
  } else {
    put_scalar(f, n);
  }
}

int main(void) {
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  if (!buf)
    return 2;
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        return 2;
      }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len, stdin);
    if (got == 0)
      break;
    len += got;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  int rc = spn_toml_parse(buf, len, "<stdin>", &doc, &err);
  free(buf);
  if (rc < 0) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  put_node(stdout, spn_toml_doc_root(doc));
  fputc('\n', stdout);
  spn_toml_doc_free(&doc);
  return 0;
}
