/* onnx-build.h — a tiny protobuf writer for hand-built ONNX models, shared
 * by the engine tests (test-engine.c, test-backend.c, test-engine-cuda.c). */
#ifndef SPN_TEST_ONNX_BUILD_H
#define SPN_TEST_ONNX_BUILD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a tiny protobuf writer ---- */

typedef struct {
  uint8_t *p;
  size_t n, cap;
} pb_t;

static inline void pb_raw(pb_t *b, const void *d, size_t n) {
  if (n == 0)
    return;
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}

static inline void pb_uv(pb_t *b, uint64_t v) {
  uint8_t t[10];
  int n = 0;
  do {
    t[n] = v & 0x7f;
    v >>= 7;
    if (v)
      t[n] |= 0x80;
    n++;
  } while (v);
  pb_raw(b, t, (size_t)n);
}

static inline void pb_int(pb_t *b, int field, int64_t v) {
  pb_uv(b, (uint64_t)field << 3);
  pb_uv(b, (uint64_t)v);
}

static inline void pb_float(pb_t *b, int field, float f) {
  pb_uv(b, (uint64_t)field << 3 | 5);
  pb_raw(b, &f, 4);
}

static inline void pb_bytes(pb_t *b, int field, const void *d, size_t n) {
  pb_uv(b, (uint64_t)field << 3 | 2);
  pb_uv(b, n);
  pb_raw(b, d, n);
}

static inline void pb_str(pb_t *b, int field, const char *s) { pb_bytes(b, field, s, strlen(s)); }

static inline void pb_msg(pb_t *b, int field, pb_t *sub) {
  pb_bytes(b, field, sub->p, sub->n);
  free(sub->p);
  memset(sub, 0, sizeof *sub);
}

/* ValueInfoProto for a float tensor; dims < 0 are dynamic ("N"). */
static inline void value_info(pb_t *g, int field, const char *name, int nd, const int64_t *dims) {
  pb_t vi = {0}, tp = {0}, tt = {0}, sh = {0};
  for (int i = 0; i < nd; i++) {
    pb_t d = {0};
    if (dims[i] < 0)
      pb_str(&d, 2, "N");
    else
      pb_int(&d, 1, dims[i]);
    pb_msg(&sh, 1, &d);
  }
  pb_int(&tt, 1, 1);
  if (nd >= 0)
    pb_msg(&tt, 2, &sh);
  else
    free(sh.p);
  pb_msg(&tp, 1, &tt);
  pb_str(&vi, 1, name);
  pb_msg(&vi, 2, &tp);
  pb_msg(g, field, &vi);
}

static inline void initializer(pb_t *g, const char *name, int nd, const int64_t *dims, const float *data,
                        size_t count) {
  pb_t t = {0};
  for (int i = 0; i < nd; i++)
    pb_int(&t, 1, dims[i]);
  pb_int(&t, 2, 1);
  pb_str(&t, 8, name);
  pb_bytes(&t, 9, data, count * sizeof(float));
  pb_msg(g, 5, &t);
}

typedef struct {
  const char *name;
  int type; /* 1 float, 2 int, 3 string, 7 ints */
  float f;
  int64_t i;
  const char *s;
  int n;
  const int64_t *ints;
} attr_t;

static inline void node(pb_t *g, const char *op, const char *name, const char *const *in, int nin,
                 const char *const *out, int nout, const attr_t *attrs, int nattr) {
  pb_t nd = {0};
  for (int i = 0; i < nin; i++)
    pb_str(&nd, 1, in[i]);
  for (int i = 0; i < nout; i++)
    pb_str(&nd, 2, out[i]);
  pb_str(&nd, 3, name);
  pb_str(&nd, 4, op);
  for (int i = 0; i < nattr; i++) {
    pb_t a = {0};
    pb_str(&a, 1, attrs[i].name);
    pb_int(&a, 20, attrs[i].type);
    switch (attrs[i].type) {
    case 1: pb_float(&a, 2, attrs[i].f); break;
    case 2: pb_int(&a, 3, attrs[i].i); break;
    case 3: pb_str(&a, 4, attrs[i].s); break;
    case 7:
      for (int k = 0; k < attrs[i].n; k++)
        pb_int(&a, 8, attrs[i].ints[k]);
      break;
    }
    pb_msg(&nd, 5, &a);
  }
  pb_msg(g, 1, &nd);
}

static inline pb_t model(pb_t *graph, int64_t opset) {
  pb_t m = {0}, os = {0};
  pb_int(&m, 1, 8);
  pb_str(&os, 1, "");
  pb_int(&os, 2, opset);
  pb_msg(&m, 8, &os);
  pb_msg(&m, 7, graph);
  return m;
}

/* The model bytes in a fresh temporary file; *path (n >= 32) gets its name
 * (the caller unlinks it). */
static inline void model_file(const pb_t *pm, char *path, size_t n) {
  snprintf(path, n, "/tmp/spn-onnx-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(pm->p, 1, pm->n, f), pm->n);
  assert_int_equal(fclose(f), 0);
}

#endif
