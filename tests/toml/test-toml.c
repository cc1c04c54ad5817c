/* test-toml.c — the TOML parser and access API: values, paths, positions,
 * error messages (line:col of real mistakes, CRLF, BOM, after multi-line
 * strings), nesting limits and a 10 MB generated document (correctness is
 * asserted; the parse time is printed, never asserted). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "spindle/toml.h"

static const char *const k_doc =
    "title = \"spindle\"\n"               /* 1 */
    "[stage]\n"                           /* 2 */
    "  name = \"decode\"\n"               /* 3 */
    "  batching.max_batch = 8\n"          /* 4 */
    "  \"quoted.key\" = 1.5\n"            /* 5 */
    "  [[stage.inputs]]\n"                /* 6 */
    "  id = 1\n"                          /* 7 */
    "  [[stage.inputs]]\n"                /* 8 */
    "  id = 2\n"                          /* 9 */
    "  tags = [\"a\", \"b\"]\n"           /* 10 */
    "[times]\n"                           /* 11 */
    "odt = 1979-05-27T07:32:00.5-07:00\n" /* 12 */
    "ldt = 1979-05-27t07:32:00\n"         /* 13 */
    "ld = 2024-02-29\n"                   /* 14 */
    "lt = 23:59:60.123456789123\n"        /* 15 */
    "nul = \"a\\u0000b\"\n"               /* 16 */
    "\"k\\u0000\" = 1\n"                  /* 17 */
    "zeta = 1\n"                          /* 18 */
    "alpha = 2\n";                        /* 19 */

static spn_toml_doc_t *parse_ok(const char *src, size_t len) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse(src, len, "t.toml", &doc, &err);
  if (rc != SPN_OK)
    fail_msg("unexpected parse error: %s", err.msg);
  assert_non_null(doc);
  return doc;
}

/* Parse must fail with SPN_EPARSE and a message starting with `want`. */
static void parse_fails(const char *src, size_t len, const char *want) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse(src, len, "t.toml", &doc, &err);
  if (rc != SPN_EPARSE || strncmp(err.msg, want, strlen(want)) != 0)
    fail_msg("want error starting \"%s\", got status %d: \"%s\"", want, rc, err.msg);
  assert_null(doc);
}

static void fails(const char *src, const char *want) { parse_fails(src, strlen(src), want); }

static void paths_and_values(void **state) {
  (void)state;
  spn_toml_doc_t *doc = parse_ok(k_doc, strlen(k_doc));
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  spn_error_t err = SPN_ERROR_INIT;
  const char *s;
  int64_t i;
  double f;
  assert_string_equal(spn_toml_doc_name(doc), "t.toml");
  assert_int_equal(spn_toml_get_string(root, "title", &s, &err), SPN_OK);
  assert_string_equal(s, "spindle");
  assert_int_equal(spn_toml_get_int(root, "stage.batching.max_batch", &i, &err), SPN_OK);
  assert_int_equal(i, 8);
  /* Integers are accepted where a float is wanted. */
  assert_int_equal(spn_toml_get_float(root, "stage.batching.max_batch", &f, &err), SPN_OK);
  assert_true(f == 8.0);
  /* A quoted segment holding a dot. */
  assert_int_equal(spn_toml_get_float(root, "stage.\"quoted.key\"", &f, &err), SPN_OK);
  assert_true(f == 1.5);
  assert_int_equal(spn_toml_get_float(root, "stage.'quoted.key'", &f, &err), SPN_OK);
  assert_true(f == 1.5);
  /* Array indexes, on arrays of tables and on plain arrays. */
  assert_int_equal(spn_toml_get_int(root, "stage.inputs[0].id", &i, &err), SPN_OK);
  assert_int_equal(i, 1);
  assert_int_equal(spn_toml_get_int(root, "stage.inputs[1].id", &i, &err), SPN_OK);
  assert_int_equal(i, 2);
  assert_int_equal(spn_toml_get_string(root, "stage.inputs[1].tags[1]", &s, &err), SPN_OK);
  assert_string_equal(s, "b");
  const spn_toml_node_t *n;
  assert_int_equal(spn_toml_get(root, "stage.inputs", SPN_TOML_ARRAY, &n, &err), SPN_OK);
  assert_int_equal(spn_toml_array_len(n), 2);
  assert_null(spn_toml_array_at(n, 2));
  /* From a sub-table. */
  const spn_toml_node_t *stage = spn_toml_table_get(root, "stage", NULL);
  assert_non_null(stage);
  assert_int_equal(spn_toml_get_string(stage, "name", &s, &err), SPN_OK);
  assert_string_equal(s, "decode");
  bool b;
  assert_int_equal(spn_toml_get_bool(root, "title", &b, &err), SPN_ETYPE);
  spn_toml_doc_free(&doc);
  assert_null(doc);
  spn_toml_doc_free(&doc); /* NULL is fine */
}

static void access_errors(void **state) {
  (void)state;
  spn_toml_doc_t *doc = parse_ok(k_doc, strlen(k_doc));
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  spn_error_t err = SPN_ERROR_INIT;
  int64_t i = 99;
  const char *s;
  const spn_toml_node_t *n = (const spn_toml_node_t *)&err;
  assert_int_equal(spn_toml_get_int(root, "stage.name", &i, &err), SPN_ETYPE);
  assert_int_equal(err.code, SPN_ETYPE);
  assert_string_equal(err.msg, "t.toml:3:10: stage.name: expected integer, got string");
  assert_int_equal(i, 99);
  assert_int_equal(spn_toml_get_string(root, "stage.nope", &s, &err), SPN_ENOENT);
  assert_string_equal(err.msg, "t.toml:2:1: no key \"nope\" in table stage");
  assert_int_equal(spn_toml_get_string(root, "zzz", &s, &err), SPN_ENOENT);
  assert_string_equal(err.msg, "t.toml:1:1: no key \"zzz\" in the top-level table");
  assert_int_equal(spn_toml_get_int(root, "stage.inputs[5].id", &i, &err), SPN_ENOENT);
  assert_string_equal(err.msg, "t.toml:6:3: stage.inputs: index 5 out of range (the array has 2 elements)");
  assert_int_equal(spn_toml_get(root, "title.x", 0, &n, &err), SPN_ETYPE);
  assert_string_equal(err.msg, "t.toml:1:9: title: expected table, got string");
  assert_null(n);
  assert_int_equal(spn_toml_get(root, "stage[0]", 0, &n, &err), SPN_ETYPE);
  assert_string_equal(err.msg, "t.toml:2:1: stage: expected array, got table");
  assert_int_equal(spn_toml_get(root, "stage..name", 0, &n, &err), SPN_EINVAL);
  assert_int_equal(spn_toml_get(root, "stage.inputs[x]", 0, &n, &err), SPN_EINVAL);
  assert_int_equal(spn_toml_get(root, "\"unterminated", 0, &n, &err), SPN_EINVAL);
  assert_int_equal(spn_toml_get(root, "", 0, &n, &err), SPN_EINVAL);
  double f;
  assert_int_equal(spn_toml_get_float(root, "stage.name", &f, &err), SPN_ETYPE);
  assert_string_equal(err.msg, "t.toml:3:10: stage.name: expected float, got string");
  spn_toml_doc_free(&doc);
}

static void document_order_and_positions(void **state) {
  (void)state;
  spn_toml_doc_t *doc = parse_ok(k_doc, strlen(k_doc));
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  spn_toml_pos_t kp;
  assert_int_equal(spn_toml_table_len(root), 3);
  assert_string_equal(spn_toml_table_key_at(root, 0, &kp), "title");
  assert_int_equal(kp.line, 1);
  assert_int_equal(kp.col, 1);
  assert_string_equal(spn_toml_table_key_at(root, 1, &kp), "stage");
  assert_int_equal(kp.line, 2);
  assert_int_equal(kp.col, 2);
  assert_string_equal(spn_toml_table_key_at(root, 2, NULL), "times");
  assert_null(spn_toml_table_key_at(root, 3, NULL));
  assert_null(spn_toml_table_value_at(root, 3));

  const spn_toml_node_t *stage = spn_toml_table_value_at(root, 1);
  assert_int_equal(spn_toml_node_type(stage), SPN_TOML_TABLE);
  const char *want_stage[] = {"name", "batching", "quoted.key", "inputs"};
  const uint32_t want_kline[] = {3, 4, 5, 6}, want_kcol[] = {3, 3, 3, 11};
  assert_int_equal(spn_toml_table_len(stage), 4);
  for (size_t i = 0; i < 4; i++) {
    assert_string_equal(spn_toml_table_key_at(stage, i, &kp), want_stage[i]);
    assert_int_equal(kp.line, want_kline[i]);
    assert_int_equal(kp.col, want_kcol[i]);
  }
  /* Value positions. */
  const spn_toml_node_t *n = spn_toml_table_get(stage, "name", &kp);
  assert_int_equal(spn_toml_node_pos(n).line, 3);
  assert_int_equal(spn_toml_node_pos(n).col, 10);
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_toml_get(root, "stage.batching.max_batch", SPN_TOML_INTEGER, &n, &err), SPN_OK);
  assert_int_equal(spn_toml_node_pos(n).line, 4);
  assert_int_equal(spn_toml_node_pos(n).col, 24);
  const spn_toml_node_t *batching = spn_toml_table_get(stage, "batching", NULL);
  assert_string_equal(spn_toml_table_key_at(batching, 0, &kp), "max_batch");
  assert_int_equal(kp.line, 4);
  assert_int_equal(kp.col, 12);
  assert_int_equal(spn_toml_get(root, "stage.inputs[1].tags[1]", SPN_TOML_STRING, &n, &err), SPN_OK);
  char where[64];
  assert_string_equal(spn_toml_node_where(n, where, sizeof where), "t.toml:10:16");
  assert_ptr_equal(spn_toml_node_doc(n), doc);
  assert_int_equal(spn_toml_get(root, "\"quoted.key\"", 0, &n, &err), SPN_ENOENT);
  assert_int_equal(spn_toml_get(stage, "\"quoted.key\"", 0, &n, &err), SPN_OK);
  assert_string_equal(spn_toml_node_where(n, where, sizeof where), "t.toml:5:18");
  /* Keys are kept as written, not sorted. */
  const spn_toml_node_t *times = spn_toml_table_get(root, "times", NULL);
  const char *want_times[] = {"odt", "ldt", "ld", "lt", "nul", "k", "zeta", "alpha"};
  assert_int_equal(spn_toml_table_len(times), 8);
  for (size_t i = 0; i < 8; i++)
    assert_string_equal(spn_toml_table_key_at(times, i, NULL), want_times[i]);
  /* A short where-buffer is truncated, still terminated. */
  assert_string_equal(spn_toml_node_where(n, where, 5), "t.to");
  spn_toml_doc_free(&doc);
}

static void embedded_nul_and_datetimes(void **state) {
  (void)state;
  spn_toml_doc_t *doc = parse_ok(k_doc, strlen(k_doc));
  const spn_toml_node_t *times = spn_toml_table_get(spn_toml_doc_root(doc), "times", NULL);
  size_t len = 0;
  const char *s = spn_toml_string(spn_toml_table_get(times, "nul", NULL), &len);
  assert_int_equal(len, 3);
  assert_memory_equal(s, "a\0b", 4);
  assert_int_equal(spn_toml_table_key_len(times, 5), 2);
  assert_memory_equal(spn_toml_table_key_at(times, 5, NULL), "k\0", 3);
  assert_int_equal(spn_toml_table_key_len(times, 99), 0);

  const spn_toml_node_t *n = spn_toml_table_get(times, "odt", NULL);
  assert_int_equal(spn_toml_node_type(n), SPN_TOML_DATETIME);
  assert_string_equal(spn_toml_type_name(spn_toml_node_type(n)), "datetime");
  spn_toml_datetime_t dt = spn_toml_datetime(n);
  assert_int_equal(dt.year, 1979);
  assert_int_equal(dt.month, 5);
  assert_int_equal(dt.day, 27);
  assert_int_equal(dt.hour, 7);
  assert_int_equal(dt.minute, 32);
  assert_int_equal(dt.second, 0);
  assert_int_equal(dt.nanosecond, 500000000);
  assert_int_equal(dt.offset_minutes, -420);
  n = spn_toml_table_get(times, "ldt", NULL);
  assert_int_equal(spn_toml_node_type(n), SPN_TOML_DATETIME_LOCAL);
  dt = spn_toml_datetime(n);
  assert_int_equal(dt.day, 27);
  assert_int_equal(dt.minute, 32);
  n = spn_toml_table_get(times, "ld", NULL);
  assert_int_equal(spn_toml_node_type(n), SPN_TOML_DATE_LOCAL);
  dt = spn_toml_datetime(n);
  assert_int_equal(dt.year, 2024);
  assert_int_equal(dt.month, 2);
  assert_int_equal(dt.day, 29);
  n = spn_toml_table_get(times, "lt", NULL);
  assert_int_equal(spn_toml_node_type(n), SPN_TOML_TIME_LOCAL);
  dt = spn_toml_datetime(n);
  assert_int_equal(dt.hour, 23);
  assert_int_equal(dt.second, 60);
  assert_int_equal(dt.nanosecond, 123456789); /* truncated, not rounded */
  spn_toml_doc_free(&doc);

  const char *more = "z = 2000-02-29 12:00:00Z\np = 1999-12-31T23:59:59+05:30\n";
  doc = parse_ok(more, strlen(more));
  n = spn_toml_table_get(spn_toml_doc_root(doc), "z", NULL);
  assert_int_equal(spn_toml_node_type(n), SPN_TOML_DATETIME);
  assert_int_equal(spn_toml_datetime(n).offset_minutes, 0);
  assert_int_equal(spn_toml_datetime(n).hour, 12);
  n = spn_toml_table_get(spn_toml_doc_root(doc), "p", NULL);
  assert_int_equal(spn_toml_datetime(n).offset_minutes, 330);
  spn_toml_doc_free(&doc);
  fails("d = 1900-02-29\n", "t.toml:1:5: February 29");
  fails("d = 2023-02-29\n", "t.toml:1:5: February 29");
  fails("d = 2023-04-31\n", "t.toml:1:5: date out of range");
  fails("d = 24:00:00\n", "t.toml:1:5: time out of range");
}

static void scalars(void **state) {
  (void)state;
  const char *src = "a = 0x7fffffffffffffff\nb = -9223372036854775808\nc = 0o17\nd = 0b101\n"
                    "e = 1_000\nf = -0.5e-3\ng = -inf\nh = 1e+2\ns = '''\nraw \\n'''\nm = \"\"\"\\\n   x\"\"\"\n";
  spn_toml_doc_t *doc = parse_ok(src, strlen(src));
  const spn_toml_node_t *r = spn_toml_doc_root(doc);
  assert_true(spn_toml_int(spn_toml_table_get(r, "a", NULL)) == INT64_MAX);
  assert_true(spn_toml_int(spn_toml_table_get(r, "b", NULL)) == INT64_MIN);
  assert_int_equal(spn_toml_int(spn_toml_table_get(r, "c", NULL)), 15);
  assert_int_equal(spn_toml_int(spn_toml_table_get(r, "d", NULL)), 5);
  assert_int_equal(spn_toml_int(spn_toml_table_get(r, "e", NULL)), 1000);
  assert_true(spn_toml_float(spn_toml_table_get(r, "f", NULL)) == -0.0005);
  double g = spn_toml_float(spn_toml_table_get(r, "g", NULL));
  assert_true(g < 0 && g * 0.5 == g); /* -inf */
  assert_true(spn_toml_float(spn_toml_table_get(r, "h", NULL)) == 100.0);
  assert_string_equal(spn_toml_string(spn_toml_table_get(r, "s", NULL), NULL), "raw \\n");
  assert_string_equal(spn_toml_string(spn_toml_table_get(r, "m", NULL), NULL), "x");
  spn_toml_doc_free(&doc);
  fails("n = 9223372036854775808\n", "t.toml:1:5: integer does not fit in 64 bits");
  fails("n = 0x8000000000000000\n", "t.toml:1:5: integer does not fit in 64 bits");
  fails("n = 012\n", "t.toml:1:5: leading zeros are not allowed");
  fails("n = 1__2\n", "t.toml:1:5: invalid number");
  fails("n = +0x1\n", "t.toml:1:5: hexadecimal, octal and binary integers cannot have a sign");
  fails("n = 1.\n", "t.toml:1:5: a decimal point must be followed by digits");
  fails("b = True\n", "t.toml:1:5: expected a value, found 'T'");
}

static void error_positions(void **state) {
  (void)state;
  fails("a = 1\na = 2\n", "t.toml:2:1: duplicate key \"a\" (first defined at 1:1)");
  fails("x = [1, 2,, 3]\n", "t.toml:1:11: expected a value, found ','");
  fails("[a]\nx = 1\n[a]\n", "t.toml:3:2: cannot define table \"a\"");
  fails("t = {x = 1}\nt.y = 2\n", "t.toml:2:1: cannot add to key \"t\" with dotted keys");
  fails("t = {x = 1}\n[t.sub]\n", "t.toml:2:2: cannot add a table to key \"t\"");
  fails("a = [1]\n[[a]]\n", "t.toml:2:3: cannot append a table to key \"a\"");
  fails("[fruit]\napple.color = 'red'\n[fruit.apple]\n", "t.toml:3:8: cannot define table \"apple\"");
  fails("a = 1 # hi\x01\n", "t.toml:1:11: control character U+0001 is not allowed");
  fails("a = 1\nb = \"\xff\"\n", "t.toml:2:6: invalid UTF-8");
  fails("a = \"abc\nb = 1\n", "t.toml:1:9: newline in a single-line string");
  fails("a = 1 b = 2\n", "t.toml:1:7: expected the end of the line, found 'b'");
  fails("t = {a = 1,\n b = 2}\n", "t.toml:1:12: newline in inline table");
  fails("a = 1\r\n\r\nb\r = 2\r\n", "t.toml:3:2: carriage return not followed by a line feed");
  fails("s = \"bad \\q\"\n", "t.toml:1:10: invalid escape \\q");
  fails("s = \"\\uD800\"\n", "t.toml:1:6: \\uD800 is not a Unicode scalar value");
  fails("a = \"open\n", "t.toml:1:10: newline in a single-line string");
  fails("a = 'open", "t.toml:1:5: unterminated string");
  fails("a = [1,\n  2\n", "t.toml:3:1: unterminated array (opened at 1:5)");
  fails("a = [1,\n", "t.toml:2:1: unterminated array (opened at 1:5)");
  fails("a = {x = 1", "t.toml:1:11: unterminated inline table (opened at 1:5)");
  fails("[a\nx=1\n", "t.toml:1:3: expected ']' to close the table header, found end of line");
}

static void error_positions_after_multiline_crlf_bom(void **state) {
  (void)state;
  /* After multi-line strings: lines inside them count. */
  fails("s = \"\"\"\nline1\nline2\"\"\"\nbad = 01\n", "t.toml:4:7: leading zeros are not allowed");
  fails("s = '''\r\n\r\nx\r\n'''\r\nt = '''\n'''\nbad = @\n", "t.toml:7:7: expected a value, found '@'");
  fails("s = \"\"\"\\\n\n   \n  x\"\"\" z\n", "t.toml:4:8: expected the end of the line, found 'z'");
  /* CRLF files: the CR is part of the line ending, never a column. */
  fails("a = 1\r\nb = [\r\n  1,\r\n  true false]\r\n", "t.toml:4:8: expected ',' or ']' in array, found 'f'");
  fails("a = 1\r\na = 2\r\n", "t.toml:2:1: duplicate key \"a\" (first defined at 1:1)");
  /* A leading BOM is skipped and not counted in columns. */
  fails("\xEF\xBB\xBFkey = @\n", "t.toml:1:7: expected a value, found '@'");
  fails("a = 1\n\xEF\xBB\xBF", "t.toml:2:1: expected a key, found byte 0xef");

  const char *crlf = "\xEF\xBB\xBF[t]\r\nk = \"\"\"a\r\nb\"\"\"\r\nn = 1\r\n";
  spn_toml_doc_t *doc = parse_ok(crlf, strlen(crlf));
  spn_error_t err = SPN_ERROR_INIT;
  const spn_toml_node_t *n;
  assert_int_equal(spn_toml_get(spn_toml_doc_root(doc), "t.k", SPN_TOML_STRING, &n, &err), SPN_OK);
  assert_string_equal(spn_toml_string(n, NULL), "a\nb"); /* CR LF inside is read as LF */
  assert_int_equal(spn_toml_get(spn_toml_doc_root(doc), "t.n", SPN_TOML_INTEGER, &n, &err), SPN_OK);
  assert_int_equal(spn_toml_node_pos(n).line, 4);
  assert_int_equal(spn_toml_node_pos(n).col, 5);
  assert_int_equal(spn_toml_get(spn_toml_doc_root(doc), "t", SPN_TOML_TABLE, &n, &err), SPN_OK);
  assert_int_equal(spn_toml_node_pos(n).line, 1);
  assert_int_equal(spn_toml_node_pos(n).col, 1);
  spn_toml_doc_free(&doc);
}

static char *repeat(const char *head, const char *unit, size_t n, const char *tail) {
  size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
  char *s = malloc(hl + ul * n + tl + 1);
  assert_non_null(s);
  memcpy(s, head, hl);
  for (size_t i = 0; i < n; i++)
    memcpy(s + hl + i * ul, unit, ul);
  memcpy(s + hl + ul * n, tail, tl + 1);
  return s;
}

static void deep_nesting(void **state) {
  (void)state;
  /* 100,000 levels of each kind fail cleanly at the 257th level. */
  char *s = repeat("a = ", "[", 100000, "");
  fails(s, "t.toml:1:261: nesting deeper than 256 levels");
  free(s);
  s = repeat("a = ", "{b=", 100000, "");
  fails(s, "t.toml:1:773: nesting deeper than 256 levels");
  free(s);
  s = repeat("", "a.", 100000, "a = 1\n");
  fails(s, "t.toml:1:513: nesting deeper than 256 levels");
  free(s);
  s = repeat("[", "a.", 100000, "a]\n");
  fails(s, "t.toml:1:514: nesting deeper than 256 levels");
  free(s);
  s = repeat("", "[", 100000, "");
  fails(s, "t.toml:1:3: expected a key, found '['");
  free(s);
  /* 256 levels are fine. */
  char *open = repeat("a = ", "[", 256, "");
  char *full = repeat(open, "]", 256, "\n");
  spn_toml_doc_t *doc = parse_ok(full, strlen(full));
  const spn_toml_node_t *n = spn_toml_table_get(spn_toml_doc_root(doc), "a", NULL);
  size_t depth = 0;
  while (spn_toml_array_len(n) > 0) {
    n = spn_toml_array_at(n, 0);
    depth++;
  }
  assert_int_equal(depth, 255);
  spn_toml_doc_free(&doc);
  free(open);
  free(full);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A generated document of about `target` bytes: many sections (a large root
 * table), one big flat table and a long array of tables. */
static char *generate(size_t target, size_t *len, size_t *nsec) {
  size_t cap = target + 4096, n = 0, i = 0;
  char *s = malloc(cap);
  assert_non_null(s);
  n += (size_t)snprintf(s + n, cap - n, "[flat]\n");
  for (; n < target / 10; i++)
    n += (size_t)snprintf(s + n, cap - n, "k%zu = %zu\n", i, i * 7);
  for (i = 0; n < target / 5; i++)
    n += (size_t)snprintf(s + n, cap - n, "[[jobs]]\nid = %zu\nname = \"job %zu\"\n", i, i);
  for (i = 0; n + 200 < target; i++)
    n += (size_t)snprintf(s + n, cap - n,
                          "[section_%zu]\nname = \"stage-%zu\" # comment\nvalue = %zu\nratio = %zu.5\n"
                          "list = [1, 2, 3, \"x\"]\ninline = { a = %zu, b.c = true }\n",
                          i, i, i, i, i);
  *len = n;
  *nsec = i;
  return s;
}

static void ten_megabytes_parse_in_linear_time(void **state) {
  (void)state;
  double t[2];
  size_t sizes[2] = {1u << 20, 10u << 20};
  for (int r = 0; r < 2; r++) {
    size_t len, nsec;
    char *src = generate(sizes[r], &len, &nsec);
    spn_error_t err = SPN_ERROR_INIT;
    spn_toml_doc_t *doc = NULL;
    double t0 = now_s();
    int32_t rc = spn_toml_parse(src, len, "big.toml", &doc, &err);
    t[r] = now_s() - t0;
    if (rc != SPN_OK)
      fail_msg("%s", err.msg);
    const spn_toml_node_t *root = spn_toml_doc_root(doc);
    /* flat, jobs, then the sections in order. */
    assert_int_equal(spn_toml_table_len(root), nsec + 2);
    char key[64];
    for (size_t i = 0; i < nsec; i += nsec / 97 + 1) {
      snprintf(key, sizeof key, "section_%zu", i);
      assert_string_equal(spn_toml_table_key_at(root, i + 2, NULL), key);
      int64_t v;
      snprintf(key, sizeof key, "section_%zu.inline.a", i);
      assert_int_equal(spn_toml_get_int(root, key, &v, &err), SPN_OK);
      assert_int_equal(v, (int64_t)i);
      double f;
      snprintf(key, sizeof key, "section_%zu.ratio", i);
      assert_int_equal(spn_toml_get_float(root, key, &f, &err), SPN_OK);
      assert_true(f == (double)i + 0.5);
      bool b = false;
      snprintf(key, sizeof key, "section_%zu.inline.b.c", i);
      assert_int_equal(spn_toml_get_bool(root, key, &b, &err), SPN_OK);
      assert_true(b);
    }
    const spn_toml_node_t *flat = spn_toml_table_get(root, "flat", NULL);
    size_t nflat = spn_toml_table_len(flat);
    for (size_t i = 0; i < nflat; i += 1013) {
      int64_t v;
      snprintf(key, sizeof key, "flat.k%zu", i);
      assert_int_equal(spn_toml_get_int(root, key, &v, &err), SPN_OK);
      assert_int_equal(v, (int64_t)(i * 7));
    }
    const spn_toml_node_t *jobs = spn_toml_table_get(root, "jobs", NULL);
    size_t njobs = spn_toml_array_len(jobs);
    assert_true(njobs > 1000);
    const char *name;
    snprintf(key, sizeof key, "jobs[%zu].name", njobs - 1);
    assert_int_equal(spn_toml_get_string(root, key, &name, &err), SPN_OK);
    snprintf(key, sizeof key, "job %zu", njobs - 1);
    assert_string_equal(name, key);
    printf("toml parse: %.2f MB in %.3f s (%.1f MB/s), %zu sections, %zu flat keys, %zu [[jobs]]\n",
           (double)len / 1e6, t[r], (double)len / 1e6 / t[r], nsec, nflat, njobs);
    spn_toml_doc_free(&doc);
    free(src);
  }
  printf("toml parse: 10 MB / 1 MB time ratio %.1f (10 means linear)\n", t[1] / t[0]);
}

static void parse_file_and_bad_args(void **state) {
  (void)state;
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  assert_int_equal(spn_toml_parse_file("/nonexistent/dir/x.toml", &doc, &err), SPN_ENOENT);
  assert_non_null(strstr(err.msg, "/nonexistent/dir/x.toml"));
  assert_null(doc);
  char path[] = "/tmp/spn-toml-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("[server]\nport = 8080\nport = 1\n", f);
  fclose(f);
  assert_int_equal(spn_toml_parse_file(path, &doc, &err), SPN_EPARSE);
  char want[128];
  snprintf(want, sizeof want, "%s:3:1: duplicate key \"port\"", path);
  assert_memory_equal(err.msg, want, strlen(want));
  f = fopen(path, "w");
  fputs("[server]\nport = 8080\n", f);
  fclose(f);
  assert_int_equal(spn_toml_parse_file(path, &doc, &err), SPN_OK);
  int64_t port;
  assert_int_equal(spn_toml_get_int(spn_toml_doc_root(doc), "server.port", &port, &err), SPN_OK);
  assert_int_equal(port, 8080);
  assert_string_equal(spn_toml_doc_name(doc), path);
  spn_toml_doc_free(&doc);
  remove(path);
  /* Empty input is an empty document. */
  doc = parse_ok("", 0);
  assert_int_equal(spn_toml_table_len(spn_toml_doc_root(doc)), 0);
  spn_toml_doc_free(&doc);
  doc = parse_ok(NULL, 0);
  spn_toml_doc_free(&doc);
  /* Bytes past `len` are never read: a NUL inside len is an error. */
  parse_fails("a = 1\0b = 2", 11, "t.toml:1:6: control character U+0000 is not allowed");
  doc = parse_ok("a = 1\0b = 2", 5);
  assert_int_equal(spn_toml_table_len(spn_toml_doc_root(doc)), 1);
  spn_toml_doc_free(&doc);
}

static void long_keys_in_messages_are_cut(void **state) {
  (void)state;
  /* Keys of every length, ending in escapes, quoted into a bounded message. */
  /* Plain bytes first so that escapes land at every offset of the buffer. */
  const char *heads[] = {"\"", "\"a", "\"aa", "\"aaa", "\"aaaa", "\"aaaaa"};
  for (size_t n = 6 * 20; n < 6 * 20 + 6 * 6; n++) {
    char *k = repeat(heads[n % 6], "\\u0001", n / 6, "\"");
    size_t kl = strlen(k);
    char *src = malloc(2 * kl + 16);
    assert_non_null(src);
    snprintf(src, 2 * kl + 16, "%s = 1\n%s = 2\n", k, k);
    spn_error_t err = SPN_ERROR_INIT;
    spn_toml_doc_t *doc = NULL;
    assert_int_equal(spn_toml_parse(src, strlen(src), "t.toml", &doc, &err), SPN_EPARSE);
    assert_memory_equal(err.msg, "t.toml:2:1: duplicate key \"", 27);
    assert_non_null(strstr(err.msg, "\\u0001\\u0001"));
    assert_non_null(strstr(err.msg, "...\" (first defined at 1:1)"));
    free(src);
    free(k);
  }
}

static void redefinition_rules(void **state) {
  (void)state;
  /* Accepted. */
  const char *ok[] = {
      "[a.b.c]\n[a]\nx = 1\n",
      "[fruit]\napple.color = 'red'\napple.taste.sweet = true\n[fruit.apple.texture]\nsmooth = true\n",
      "[[a.b]]\nx = 1\n[a]\ny = 2\n",
      "t = { a.b = 1, a.c = 2 }\n",
      "[[x]]\n[x.y]\n[[x]]\n[x.y]\n",
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    spn_toml_doc_t *doc = parse_ok(ok[i], strlen(ok[i]));
    spn_toml_doc_free(&doc);
  }
  fails("[a]\n[a]\n", "t.toml:2:2: cannot define table \"a\"");
  fails("[a.b]\n[a]\n[a]\n", "t.toml:3:2: cannot define table \"a\"");
  fails("[a.b.c]\nz = 9\n[a]\nb.c.t = 1\n", "t.toml:4:1: cannot add to key \"b\" with dotted keys");
  fails("a.b = 1\n[a]\n", "t.toml:2:2: cannot define table \"a\": it is a table defined by dotted keys");
  fails("[[a]]\n[a]\n", "t.toml:2:2: cannot define table \"a\": it is an array of tables");
  fails("[a]\n[[a]]\n", "t.toml:2:3: cannot append a table to key \"a\": it is a table");
  fails("t = { a = {b = 1}, a.c = 2 }\n", "t.toml:1:20: cannot add to key \"a\" with dotted keys");
  fails("t = { a = 1, a = 2 }\n", "t.toml:1:14: duplicate key \"a\"");
  fails("a = false\na.b = true\n", "t.toml:2:1: cannot add to key \"a\" with dotted keys: it is boolean");
  fails("a = [{}]\n[[a]]\n", "t.toml:2:3: cannot append a table to key \"a\": it is an array");
  fails("t = {}\n[t.x]\n", "t.toml:2:2: cannot add a table to key \"t\": it is an inline table");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(paths_and_values),
      cmocka_unit_test(access_errors),
      cmocka_unit_test(document_order_and_positions),
      cmocka_unit_test(embedded_nul_and_datetimes),
      cmocka_unit_test(scalars),
      cmocka_unit_test(error_positions),
      cmocka_unit_test(error_positions_after_multiline_crlf_bom),
      cmocka_unit_test(redefinition_rules),
      cmocka_unit_test(long_keys_in_messages_are_cut),
      cmocka_unit_test(deep_nesting),
      cmocka_unit_test(parse_file_and_bad_args),
      cmocka_unit_test(ten_megabytes_parse_in_linear_time),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
