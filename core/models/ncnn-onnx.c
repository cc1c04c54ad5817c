/* ncnn-onnx.c — ncnn .param/.bin to ONNX (see ncnn-onnx.h).
 *
 * The .param is text: the magic 7767517, then "layer_count blob_count",
 * then one line per layer: type, name, input count, output count, the input
 * blob names, the output blob names and key=value parameters (a negative key
 * -23300-k is parameter k holding an array "n,v1,...,vn"). The .bin holds
 * the weights of the layers in .param order, each weight either raw float32
 * (ncnn's "type 1": biases, PReLU slopes) or preceded by a 4-byte tag
 * ("type 0": convolution kernels): 0x01306B47 for float16 data padded to 4
 * bytes, 0x0002C056 or 0 for float32 data; other tags (int8, quantised
 * tables) are refused.
 *
 * Invariants: every ONNX node's inputs name a value produced earlier (ncnn
 * lists layers in execution order, and a blob used before it is produced is
 * refused), every .bin byte is consumed exactly once, and all memory of the
 * ONNX message lives in one arena freed after packing.
 */
#include "ncnn-onnx.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"

#define NCNN_MAGIC 7767517
#define TAG_FP16 0x01306B47u
#define TAG_FP32 0x0002C056u
#define MAX_PARAM_ID 32
#define MAX_ARRAY 64

/* ---- arena: every allocation of the message, freed at once ---- */
typedef struct arena_block {
  struct arena_block *next;
  max_align_t data[];
} arena_block_t;

typedef struct conv {
  arena_block_t *blocks;
  const char *param_path, *bin_path;
  int line;
  char *msg;
  size_t msz;
  /* .bin */
  const uint8_t *bin;
  size_t bin_len, bin_pos;
  /* blob name (ncnn) -> value name (ONNX); the ONNX name differs only for
   * Split outputs (aliases of the split's input) and the graph input. */
  char **blob_ncnn, **blob_onnx;
  int *blob_uses;
  size_t n_blobs, cap_blobs;
  /* graph being built */
  SpnOnnx__NodeProto **nodes;
  size_t n_nodes, cap_nodes;
  SpnOnnx__TensorProto **inits;
  size_t n_inits, cap_inits;
  int input_count;
  char *input_name;
} conv_t;

static void *arena_alloc(conv_t *c, size_t n) {
  arena_block_t *b = calloc(1, sizeof *b + n);
  if (!b)
    return NULL;
  b->next = c->blocks;
  c->blocks = b;
  return b->data;
}

static void arena_free(conv_t *c) {
  while (c->blocks) {
    arena_block_t *n = c->blocks->next;
    free(c->blocks);
    c->blocks = n;
  }
}

static char *arena_strdup(conv_t *c, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = arena_alloc(c, n);
  if (d)
    memcpy(d, s, n);
  return d;
}

static int fail(conv_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(conv_t *c, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (c->line > 0)
    snprintf(c->msg, c->msz, "%s:%d: %s", c->param_path, c->line, what);
  else
    snprintf(c->msg, c->msz, "%s", what);
  return -1;
}

static int oom(conv_t *c) { return fail(c, "out of memory"); }

/* ---- growing arrays (plain realloc; freed in spn_ncnn_to_onnx) ---- */
static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t nc = *cap ? *cap * 2 : 64;
  while (nc < need)
    nc *= 2;
  void *q = realloc(*p, nc * elem);
  if (!q)
    return -1;
  *p = q;
  *cap = nc;
  return 0;
}

/* ---- blobs ---- */
static long blob_find(const conv_t *c, const char *ncnn_name) {
  for (size_t i = c->n_blobs; i-- > 0;)
    if (!strcmp(c->blob_ncnn[i], ncnn_name))
      return (long)i;
  return -1;
}

static int blob_add(conv_t *c, const char *ncnn_name, const char *onnx_name) {
  if (blob_find(c, ncnn_name) >= 0)
    return fail(c, "blob '%s' is produced twice", ncnn_name);
  size_t cap = c->cap_blobs;
  if (grow((void **)&c->blob_ncnn, &cap, c->n_blobs + 1, sizeof(char *)))
    return oom(c);
  cap = c->cap_blobs;
  if (grow((void **)&c->blob_onnx, &cap, c->n_blobs + 1, sizeof(char *)))
    return oom(c);
  cap = c->cap_blobs;
  if (grow((void **)&c->blob_uses, &cap, c->n_blobs + 1, sizeof(int)))
    return oom(c);
  c->cap_blobs = cap;
  c->blob_ncnn[c->n_blobs] = arena_strdup(c, ncnn_name);
  c->blob_onnx[c->n_blobs] = arena_strdup(c, onnx_name);
  c->blob_uses[c->n_blobs] = 0;
  if (!c->blob_ncnn[c->n_blobs] || !c->blob_onnx[c->n_blobs])
    return oom(c);
  c->n_blobs++;
  return 0;
}

/* The ONNX value an ncnn input blob names, counting the use. */
static const char *blob_use(conv_t *c, const char *ncnn_name) {
  long i = blob_find(c, ncnn_name);
  if (i < 0) {
    fail(c, "blob '%s' is used before any layer produces it", ncnn_name);
    return NULL;
  }
  c->blob_uses[i]++;
  return c->blob_onnx[i];
}

/* ---- layer parameters ---- */
typedef struct params {
  bool set[MAX_PARAM_ID];
  bool is_array[MAX_PARAM_ID];
  double v[MAX_PARAM_ID];
  int n_arr[MAX_PARAM_ID];
  double arr[MAX_PARAM_ID][MAX_ARRAY];
} params_t;

static int parse_number(conv_t *c, const char *s, double *out, const char *tok) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !isfinite(v))
    return fail(c, "bad parameter value in '%s'", tok);
  *out = v;
  return (size_t)(end - s) == strlen(s) ? 0 : fail(c, "bad parameter value in '%s'", tok);
}

static int parse_param(conv_t *c, params_t *p, char *tok) {
  char *eq = strchr(tok, '=');
  char *end;
  if (!eq)
    return fail(c, "parameter '%s' is not key=value", tok);
  *eq = 0;
  long key = strtol(tok, &end, 10);
  *eq = '=';
  if (end == tok || *end != '=')
    return fail(c, "parameter '%s' has a bad key", tok);
  bool array = key <= -23300;
  long id = array ? -(key + 23300) : key;
  if (id < 0 || id >= MAX_PARAM_ID)
    return fail(c, "parameter '%s': key out of range", tok);
  if (p->set[id])
    return fail(c, "parameter %ld given twice", id);
  p->set[id] = true;
  p->is_array[id] = array;
  if (!array)
    return parse_number(c, eq + 1, &p->v[id], tok);
  char *s = eq + 1;
  long n = strtol(s, &end, 10);
  if (end == s || n < 0 || n > MAX_ARRAY)
    return fail(c, "parameter '%s': bad array length", tok);
  s = end;
  for (long i = 0; i < n; i++) {
    if (*s != ',')
      return fail(c, "parameter '%s': array has fewer than %ld values", tok, n);
    s++;
    char *comma = strchr(s, ',');
    char save = 0;
    if (comma) {
      save = *comma;
      *comma = 0;
    }
    int rc = parse_number(c, s, &p->arr[id][i], tok);
    if (comma)
      *comma = save;
    if (rc)
      return rc;
    s = comma ? comma : s + strlen(s);
  }
  if (*s)
    return fail(c, "parameter '%s': array has more than %ld values", tok, n);
  p->n_arr[id] = (int)n;
  return 0;
}

/* An integer parameter, or def when absent. */
static int pint(const params_t *p, int id, int def) { return p->set[id] && !p->is_array[id] ? (int)p->v[id] : def; }
static float pfloat(const params_t *p, int id, float def) {
  return p->set[id] && !p->is_array[id] ? (float)p->v[id] : def;
}

/* Refuse any parameter this converter does not understand for the layer:
 * a silently ignored parameter would convert into a different model. */
static int check_known(conv_t *c, const params_t *p, const char *type, const char *known) {
  for (int id = 0; id < MAX_PARAM_ID; id++) {
    if (!p->set[id])
      continue;
    char tag[16];
    snprintf(tag, sizeof tag, ",%d,", id);
    char list[128];
    snprintf(list, sizeof list, ",%s,", known);
    if (!strstr(list, tag))
      return fail(c, "%s parameter %d is not supported by the converter", type, id);
  }
  return 0;
}

/* ---- weights ---- */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while (!(mant & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Read n weights into dst. tagged: ncnn "type 0" (a storage tag first). */
static int read_weights(conv_t *c, float *dst, size_t n, bool tagged, const char *what) {
  uint32_t tag = 0;
  if (tagged) {
    if (c->bin_len - c->bin_pos < 4)
      return fail(c, "%s: %s ends before the %s's storage tag (offset %zu)", what, c->bin_path, what, c->bin_pos);
    memcpy(&tag, c->bin + c->bin_pos, 4);
    c->bin_pos += 4;
  }
  if (tag == TAG_FP16) {
    size_t bytes = (n * 2 + 3) / 4 * 4;
    if (c->bin_len - c->bin_pos < bytes)
      return fail(c, "%s: %s ends inside the float16 %s (offset %zu, %zu bytes needed)", what, c->bin_path, what,
                  c->bin_pos, bytes);
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, c->bin + c->bin_pos + 2 * i, 2);
      dst[i] = half_to_float(h);
    }
    c->bin_pos += bytes;
    return 0;
  }
  if (tag != 0 && tag != TAG_FP32)
    return fail(c, "%s: %s at offset %zu: weight storage tag 0x%08x is not float32 or float16 (int8 and quantised "
                   "weights are not supported)",
                what, c->bin_path, c->bin_pos - 4, tag);
  if ((c->bin_len - c->bin_pos) / 4 < n)
    return fail(c, "%s: %s ends inside the float32 %s (offset %zu, %zu bytes needed)", what, c->bin_path, what,
                c->bin_pos, n * 4);
  memcpy(dst, c->bin + c->bin_pos, n * 4);
  c->bin_pos += n * 4;
  return 0;
}

/* ---- ONNX construction ---- */
static SpnOnnx__TensorProto *add_init(conv_t *c, const char *name, const int64_t *dims, size_t nd, float **data) {
  size_t n = 1;
  for (size_t i = 0; i < nd; i++)
    n *= (size_t)dims[i];
  SpnOnnx__TensorProto *t = arena_alloc(c, sizeof *t);
  int64_t *d = arena_alloc(c, nd * sizeof *d + 1);
  float *f = arena_alloc(c, n * sizeof(float) + 1);
  if (!t || !d || !f || grow((void **)&c->inits, &c->cap_inits, c->n_inits + 1, sizeof *c->inits))
    return NULL;
  *t = (SpnOnnx__TensorProto)SPN_ONNX__TENSOR_PROTO__INIT;
  memcpy(d, dims, nd * sizeof *d);
  t->n_dims = nd;
  t->dims = d;
  t->has_data_type = 1;
  t->data_type = 1; /* FLOAT */
  t->name = arena_strdup(c, name);
  t->has_raw_data = 1;
  t->raw_data.len = n * sizeof(float);
  t->raw_data.data = (uint8_t *)f;
  if (!t->name)
    return NULL;
  c->inits[c->n_inits++] = t;
  *data = f;
  return t;
}

static SpnOnnx__NodeProto *add_node(conv_t *c, const char *op, const char *name, const char *const *in, size_t nin,
                                    const char *out) {
  SpnOnnx__NodeProto *n = arena_alloc(c, sizeof *n);
  char **ins = arena_alloc(c, (nin + 1) * sizeof *ins);
  char **outs = arena_alloc(c, sizeof *outs);
  if (!n || !ins || !outs || grow((void **)&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof *c->nodes))
    return NULL;
  *n = (SpnOnnx__NodeProto)SPN_ONNX__NODE_PROTO__INIT;
  for (size_t i = 0; i < nin; i++)
    if (!(ins[i] = arena_strdup(c, in[i])))
      return NULL;
  if (!(outs[0] = arena_strdup(c, out)) || !(n->op_type = arena_strdup(c, op)) || !(n->name = arena_strdup(c, name)))
    return NULL;
  n->n_input = nin;
  n->input = ins;
  n->n_output = 1;
  n->output = outs;
  c->nodes[c->n_nodes++] = n;
  return n;
}

static SpnOnnx__AttributeProto *add_attr(conv_t *c, SpnOnnx__NodeProto *n, const char *name) {
  SpnOnnx__AttributeProto **a = arena_alloc(c, (n->n_attribute + 1) * sizeof *a);
  SpnOnnx__AttributeProto *at = arena_alloc(c, sizeof *at);
  if (!a || !at)
    return NULL;
  *at = (SpnOnnx__AttributeProto)SPN_ONNX__ATTRIBUTE_PROTO__INIT;
  if (!(at->name = arena_strdup(c, name)))
    return NULL;
  if (n->n_attribute)
    memcpy(a, n->attribute, n->n_attribute * sizeof *a);
  a[n->n_attribute++] = at;
  n->attribute = a;
  at->has_type = 1;
  return at;
}

static int attr_int(conv_t *c, SpnOnnx__NodeProto *n, const char *name, int64_t v) {
  SpnOnnx__AttributeProto *a = add_attr(c, n, name);
  if (!a)
    return oom(c);
  a->type = SPN_ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->has_i = 1;
  a->i = v;
  return 0;
}

static int attr_float(conv_t *c, SpnOnnx__NodeProto *n, const char *name, float v) {
  SpnOnnx__AttributeProto *a = add_attr(c, n, name);
  if (!a)
    return oom(c);
  a->type = SPN_ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
  a->has_f = 1;
  a->f = v;
  return 0;
}

static int attr_ints(conv_t *c, SpnOnnx__NodeProto *n, const char *name, const int64_t *v, size_t k) {
  SpnOnnx__AttributeProto *a = add_attr(c, n, name);
  int64_t *d = arena_alloc(c, k * sizeof *d);
  if (!a || !d)
    return oom(c);
  memcpy(d, v, k * sizeof *d);
  a->type = SPN_ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
  a->n_ints = k;
  a->ints = d;
  return 0;
}

static int attr_str(conv_t *c, SpnOnnx__NodeProto *n, const char *name, const char *s) {
  SpnOnnx__AttributeProto *a = add_attr(c, n, name);
  char *d = arena_strdup(c, s);
  if (!a || !d)
    return oom(c);
  a->type = SPN_ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
  a->has_s = 1;
  a->s.data = (uint8_t *)d;
  a->s.len = strlen(d);
  return 0;
}

/* A one-element float initializer named <layer>_<what>. */
static const char *scalar_init(conv_t *c, const char *layer, const char *what, float v) {
  char nm[300];
  snprintf(nm, sizeof nm, "%s_%s", layer, what);
  int64_t dims[1] = {1};
  float *f;
  SpnOnnx__TensorProto *t = add_init(c, nm, dims, 1, &f);
  if (!t)
    return NULL;
  f[0] = v;
  return t->name;
}

/* The activation fused into a Convolution (ncnn parameter 9, its arguments
 * in array parameter 10), as a node after the convolution. */
static int add_activation(conv_t *c, const char *layer, const params_t *p, const char *in, const char *out) {
  int type = pint(p, 9, 0);
  const double *a = p->arr[10];
  int na = p->is_array[10] ? p->n_arr[10] : 0;
  char nm[300];
  snprintf(nm, sizeof nm, "%s_act", layer);
  SpnOnnx__NodeProto *n;
  switch (type) {
  case 1:
    return add_node(c, "Relu", nm, &in, 1, out) ? 0 : oom(c);
  case 2:
    if (na < 1)
      return fail(c, "Convolution '%s': leaky ReLU activation without its slope", layer);
    if (a[0] == 0.0)
      return add_node(c, "Relu", nm, &in, 1, out) ? 0 : oom(c);
    if (!(n = add_node(c, "LeakyRelu", nm, &in, 1, out)))
      return oom(c);
    return attr_float(c, n, "alpha", (float)a[0]);
  case 3: {
    if (na < 2)
      return fail(c, "Convolution '%s': clip activation without min and max", layer);
    const char *lo = scalar_init(c, layer, "clip_min", (float)a[0]);
    const char *hi = scalar_init(c, layer, "clip_max", (float)a[1]);
    /* Clip's bounds are scalars (rank 0). */
    if (!lo || !hi)
      return oom(c);
    c->inits[c->n_inits - 1]->n_dims = 0;
    c->inits[c->n_inits - 2]->n_dims = 0;
    const char *ins[3] = {in, lo, hi};
    return add_node(c, "Clip", nm, ins, 3, out) ? 0 : oom(c);
  }
  case 4:
    return add_node(c, "Sigmoid", nm, &in, 1, out) ? 0 : oom(c);
  default:
    return fail(c, "Convolution '%s': activation type %d is not supported by the converter", layer, type);
  }
}

static int conv_convolution(conv_t *c, const char *name, const params_t *p, const char *in, const char *out) {
  if (check_known(c, p, "Convolution", "0,1,2,3,4,5,6,9,10,11,12,13,14,15,16"))
    return -1;
  int co = pint(p, 0, 0), kw = pint(p, 1, 0), kh = pint(p, 11, kw);
  int dw = pint(p, 2, 1), dh = pint(p, 12, dw), sw = pint(p, 3, 1), sh = pint(p, 13, sw);
  int pl = pint(p, 4, 0), pt = pint(p, 14, pl), pr = pint(p, 15, pl), pb = pint(p, 16, pt);
  int bias = pint(p, 5, 0), wsize = pint(p, 6, 0);
  if (co <= 0 || kw <= 0 || kh <= 0 || dw <= 0 || dh <= 0 || sw <= 0 || sh <= 0)
    return fail(c, "Convolution '%s': output channels, kernel, dilation and stride must be positive", name);
  if (pl < 0 || pt < 0 || pr < 0 || pb < 0)
    return fail(c, "Convolution '%s': automatic (negative) padding is not supported by the converter", name);
  if (wsize <= 0 || wsize % (co * kw * kh))
    return fail(c, "Convolution '%s': weight_data_size %d is not a multiple of %d x %d x %d", name, wsize, co, kh,
                kw);
  char wn[300], bn[300];
  snprintf(wn, sizeof wn, "%s_weight", name);
  snprintf(bn, sizeof bn, "%s_bias", name);
  int64_t wd[4] = {co, wsize / (co * kw * kh), kh, kw};
  float *w, *b;
  if (!add_init(c, wn, wd, 4, &w))
    return oom(c);
  if (read_weights(c, w, (size_t)wsize, true, "weights"))
    return -1;
  if (bias) {
    int64_t bd[1] = {co};
    if (!add_init(c, bn, bd, 1, &b))
      return oom(c);
    if (read_weights(c, b, (size_t)co, false, "bias"))
      return -1;
  }
  const char *ins[3] = {in, wn, bn};
  bool act = pint(p, 9, 0) != 0;
  char mid[300];
  snprintf(mid, sizeof mid, "%s_conv", name);
  SpnOnnx__NodeProto *n = add_node(c, "Conv", name, ins, bias ? 3 : 2, act ? mid : out);
  int64_t ks[2] = {kh, kw}, st[2] = {sh, sw}, dl[2] = {dh, dw}, pads[4] = {pt, pl, pb, pr};
  if (!n || attr_ints(c, n, "kernel_shape", ks, 2) || attr_ints(c, n, "strides", st, 2) ||
      attr_ints(c, n, "dilations", dl, 2) || attr_ints(c, n, "pads", pads, 4))
    return n ? -1 : oom(c);
  return act ? add_activation(c, name, p, mid, out) : 0;
}

static int conv_interp(conv_t *c, const char *name, const params_t *p, const char *in, const char *out) {
  if (check_known(c, p, "Interp", "0,1,2,3,4,5,6"))
    return -1;
  int type = pint(p, 0, 0), align = pint(p, 6, 0);
  float hs = pfloat(p, 1, 1.f), ws = pfloat(p, 2, 1.f);
  if (pint(p, 3, 0) || pint(p, 4, 0) || pint(p, 5, 0))
    return fail(c, "Interp '%s': resizing to a fixed or dynamic size is not supported by the converter (scales only)",
                name);
  if (!(hs > 0.f) || !(ws > 0.f))
    return fail(c, "Interp '%s': scales must be positive", name);
  static const char *const modes[] = {NULL, "nearest", "linear", "cubic"};
  if (type < 1 || type > 3)
    return fail(c, "Interp '%s': resize type %d is not supported by the converter", name, type);
  char sn[300];
  snprintf(sn, sizeof sn, "%s_scales", name);
  int64_t sd[1] = {4};
  float *s;
  if (!add_init(c, sn, sd, 1, &s))
    return oom(c);
  s[0] = 1.f;
  s[1] = 1.f;
  s[2] = hs;
  s[3] = ws;
  const char *ins[3] = {in, "", sn};
  SpnOnnx__NodeProto *n = add_node(c, "Resize", name, ins, 3, out);
  if (!n || attr_str(c, n, "mode", modes[type]))
    return n ? -1 : oom(c);
  /* ncnn's nearest takes floor(x / scale); its linear and cubic sample at
   * pixel centres (or corners with align_corner), cubic with a = -0.75 and
   * the edge pixel repeated outside the image. */
  if (type == 1)
    return attr_str(c, n, "coordinate_transformation_mode", "asymmetric") ||
           attr_str(c, n, "nearest_mode", "floor");
  if (attr_str(c, n, "coordinate_transformation_mode", align ? "align_corners" : "half_pixel"))
    return -1;
  return type == 3 ? attr_float(c, n, "cubic_coeff_a", -0.75f) : 0;
}

static int conv_binaryop(conv_t *c, const char *name, const params_t *p, const char *const *in, int nin,
                         const char *out) {
  if (check_known(c, p, "BinaryOp", "0,1,2"))
    return -1;
  static const char *const ops[] = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sub", "Div"};
  int op = pint(p, 0, 0);
  if (op < 0 || op > 8)
    return fail(c, "BinaryOp '%s': operation %d is not supported by the converter", name, op);
  const char *ins[2];
  if (pint(p, 1, 0)) {
    if (nin != 1)
      return fail(c, "BinaryOp '%s': a scalar operation takes one input, not %d", name, nin);
    ins[0] = in[0];
    if (!(ins[1] = scalar_init(c, name, "b", pfloat(p, 2, 0.f))))
      return oom(c);
  } else {
    if (nin != 2)
      return fail(c, "BinaryOp '%s': takes two inputs, not %d", name, nin);
    ins[0] = in[0];
    ins[1] = in[1];
  }
  if (op >= 7) { /* reversed subtraction / division */
    const char *t = ins[0];
    ins[0] = ins[1];
    ins[1] = t;
  }
  return add_node(c, ops[op], name, ins, 2, out) ? 0 : oom(c);
}

static int conv_eltwise(conv_t *c, const char *name, const params_t *p, const char *const *in, int nin,
                        const char *out) {
  if (check_known(c, p, "Eltwise", "0,1"))
    return -1;
  int op = pint(p, 0, 1);
  int nco = p->is_array[1] ? p->n_arr[1] : 0;
  if (nin < 2)
    return fail(c, "Eltwise '%s': needs at least two inputs", name);
  if (op < 0 || op > 2)
    return fail(c, "Eltwise '%s': operation %d is not supported by the converter", name, op);
  if (nco && (op != 1 || nco != nin))
    return fail(c, "Eltwise '%s': coefficients are for a sum, one per input (%d given for %d inputs)", name, nco,
                nin);
  static const char *const ops[] = {"Mul", "Add", "Max"};
  /* Scale each input by its coefficient (sum only), then fold left. */
  const char *terms[MAX_ARRAY];
  char tn[MAX_ARRAY][300];
  if (nin > MAX_ARRAY)
    return fail(c, "Eltwise '%s': too many inputs", name);
  for (int i = 0; i < nin; i++) {
    terms[i] = in[i];
    if (nco && p->arr[1][i] != 1.0) {
      char what[32];
      snprintf(what, sizeof what, "coeff%d", i);
      snprintf(tn[i], sizeof tn[i], "%s_term%d", name, i);
      const char *k = scalar_init(c, name, what, (float)p->arr[1][i]);
      const char *ins[2] = {in[i], k};
      if (!k || !add_node(c, "Mul", tn[i], ins, 2, tn[i]))
        return oom(c);
      terms[i] = tn[i];
    }
  }
  char acc[300] = "";
  for (int i = 1; i < nin; i++) {
    char nm[300];
    if (i == nin - 1)
      snprintf(nm, sizeof nm, "%s", out);
    else
      snprintf(nm, sizeof nm, "%s_acc%d", name, i);
    const char *ins[2] = {i == 1 ? terms[0] : acc, terms[i]};
    char node_name[300];
    snprintf(node_name, sizeof node_name, i == nin - 1 ? "%s" : "%s_%d", name, i);
    if (!add_node(c, ops[op], node_name, ins, 2, nm))
      return oom(c);
    snprintf(acc, sizeof acc, "%s", nm);
  }
  return 0;
}

/* One layer line, already split into tokens. */
static int conv_layer(conv_t *c, char **tok, int ntok) {
  if (ntok < 4)
    return fail(c, "a layer line needs type, name, input count and output count");
  const char *type = tok[0], *name = tok[1];
  char *end;
  long nin = strtol(tok[2], &end, 10);
  if (*end || nin < 0 || nin > MAX_ARRAY)
    return fail(c, "layer '%s': bad input count '%s'", name, tok[2]);
  long nout = strtol(tok[3], &end, 10);
  if (*end || nout < 0 || nout > 4096)
    return fail(c, "layer '%s': bad output count '%s'", name, tok[3]);
  if (ntok < 4 + nin + nout)
    return fail(c, "layer '%s': %ld inputs and %ld outputs declared, fewer names given", name, nin, nout);
  params_t *pp = calloc(1, sizeof *pp); /* large: on the heap */
  if (!pp)
    return oom(c);
  int rc = 0;
  for (int i = 4 + (int)(nin + nout); i < ntok && !rc; i++)
    rc = parse_param(c, pp, tok[i]);
  const char *ins[MAX_ARRAY];
  for (long i = 0; i < nin && !rc; i++)
    if (!(ins[i] = blob_use(c, tok[4 + i])))
      rc = -1;
  char **outs = tok + 4 + nin;
  if (rc)
    goto out;

  if (!strcmp(type, "Input")) {
    if (nin != 0 || nout != 1)
      rc = fail(c, "Input '%s': takes no input and gives one output", name);
    else if (c->input_count++)
      rc = fail(c, "Input '%s': a second input layer (only single-input models are supported)", name);
    else
      rc = blob_add(c, outs[0], "input");
    goto out;
  }
  if (!strcmp(type, "Split")) {
    if (nin != 1)
      rc = fail(c, "Split '%s': takes one input", name);
    for (long i = 0; i < nout && !rc; i++)
      rc = blob_add(c, outs[i], ins[0]);
    goto out;
  }
  if (nout != 1) {
    rc = fail(c, "%s '%s': %ld outputs (one expected)", type, name, nout);
    goto out;
  }
  if ((rc = blob_add(c, outs[0], outs[0])))
    goto out;
  const char *o = outs[0];
  bool one_in = nin == 1;
  if (!strcmp(type, "Convolution")) {
    rc = one_in ? conv_convolution(c, name, pp, ins[0], o) : fail(c, "Convolution '%s': takes one input", name);
  } else if (!strcmp(type, "ReLU")) {
    if (!one_in || check_known(c, pp, "ReLU", "0")) {
      rc = one_in ? -1 : fail(c, "ReLU '%s': takes one input", name);
    } else if (pfloat(pp, 0, 0.f) == 0.f) {
      rc = add_node(c, "Relu", name, ins, 1, o) ? 0 : oom(c);
    } else {
      SpnOnnx__NodeProto *n = add_node(c, "LeakyRelu", name, ins, 1, o);
      rc = n ? attr_float(c, n, "alpha", pfloat(pp, 0, 0.f)) : oom(c);
    }
  } else if (!strcmp(type, "PReLU")) {
    int ns = pint(pp, 0, 0);
    float *s;
    char sn[300];
    snprintf(sn, sizeof sn, "%s_slope", name);
    int64_t sd[3] = {ns, 1, 1};
    if (!one_in || check_known(c, pp, "PReLU", "0"))
      rc = one_in ? -1 : fail(c, "PReLU '%s': takes one input", name);
    else if (ns <= 0)
      rc = fail(c, "PReLU '%s': num_slope must be positive", name);
    else if (!add_init(c, sn, sd, ns == 1 ? 1 : 3, &s))
      rc = oom(c);
    else if (!(rc = read_weights(c, s, (size_t)ns, false, "slopes"))) {
      const char *pin[2] = {ins[0], sn};
      rc = add_node(c, "PRelu", name, pin, 2, o) ? 0 : oom(c);
    }
  } else if (!strcmp(type, "PixelShuffle")) {
    int f = pint(pp, 0, 1), mode = pint(pp, 1, 0);
    SpnOnnx__NodeProto *n;
    if (!one_in || check_known(c, pp, "PixelShuffle", "0,1"))
      rc = one_in ? -1 : fail(c, "PixelShuffle '%s': takes one input", name);
    else if (f < 1 || mode < 0 || mode > 1)
      rc = fail(c, "PixelShuffle '%s': bad upscale factor %d or mode %d", name, f, mode);
    else if (!(n = add_node(c, "DepthToSpace", name, ins, 1, o)))
      rc = oom(c);
    else
      rc = attr_int(c, n, "blocksize", f) || attr_str(c, n, "mode", mode ? "DCR" : "CRD");
  } else if (!strcmp(type, "Interp")) {
    rc = one_in ? conv_interp(c, name, pp, ins[0], o) : fail(c, "Interp '%s': takes one input", name);
  } else if (!strcmp(type, "BinaryOp")) {
    rc = conv_binaryop(c, name, pp, ins, (int)nin, o);
  } else if (!strcmp(type, "Eltwise")) {
    rc = conv_eltwise(c, name, pp, ins, (int)nin, o);
  } else if (!strcmp(type, "Concat")) {
    SpnOnnx__NodeProto *n;
    int axis = pint(pp, 0, 0);
    if (check_known(c, pp, "Concat", "0"))
      rc = -1;
    else if (nin < 1)
      rc = fail(c, "Concat '%s': needs an input", name);
    else if (!(n = add_node(c, "Concat", name, ins, (size_t)nin, o)))
      rc = oom(c);
    else /* ncnn's axes leave out the batch */
      rc = attr_int(c, n, "axis", axis >= 0 ? axis + 1 : axis);
  } else {
    rc = fail(c, "layer type '%s' (layer '%s') is not supported by the converter", type, name);
  }
out:
  free(pp);
  return rc;
}

static uint8_t *read_file(const char *path, size_t *len, char *msg, size_t msz) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(msg, msz, "%s: %s", path, strerror(errno));
    return NULL;
  }
  uint8_t *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0)
    n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) || !(buf = malloc((size_t)n + 1)) || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    snprintf(msg, msz, "%s: cannot read", path);
    free(buf);
    buf = NULL;
  } else {
    buf[n] = 0;
    *len = (size_t)n;
  }
  fclose(f);
  return buf;
}

#define MAX_TOKENS 4200

static int convert_text(conv_t *c, char *text, size_t len) {
  if (memchr(text, 0, len))
    return fail(c, "%s: not a text file (NUL byte)", c->param_path);
  char **tok = malloc(MAX_TOKENS * sizeof *tok);
  if (!tok)
    return oom(c);
  int rc = 0, layers = -1, seen = 0;
  char *save_line = NULL;
  c->line = 0;
  for (char *ln = text; ln && !rc; ln = save_line) {
    save_line = strchr(ln, '\n');
    if (save_line)
      *save_line++ = 0;
    c->line++;
    int nt = 0;
    char *sp = NULL;
    for (char *t = strtok_r(ln, " \t\r", &sp); t; t = strtok_r(NULL, " \t\r", &sp)) {
      if (nt == MAX_TOKENS) {
        rc = fail(c, "too many fields on one line");
        break;
      }
      tok[nt++] = t;
    }
    if (rc || nt == 0)
      continue;
    if (c->line == 1) {
      if (nt != 1 || strtol(tok[0], NULL, 10) != NCNN_MAGIC)
        rc = fail(c, "not an ncnn .param file (the first line must be the magic number %d)", NCNN_MAGIC);
    } else if (layers < 0) {
      char *e1, *e2;
      long l = nt == 2 ? strtol(tok[0], &e1, 10) : -1, b = nt == 2 ? strtol(tok[1], &e2, 10) : -1;
      if (nt != 2 || *e1 || *e2 || l <= 0 || b <= 0 || l > 100000)
        rc = fail(c, "the second line must be \"layer_count blob_count\"");
      layers = (int)l;
    } else {
      if (++seen > layers)
        rc = fail(c, "more layers than the %d declared on line 2", layers);
      else
        rc = conv_layer(c, tok, nt);
    }
  }
  if (!rc && seen != layers) {
    c->line = 0;
    rc = fail(c, "%s: %d layers declared, %d found", c->param_path, layers < 0 ? 0 : layers, seen);
  }
  free(tok);
  return rc;
}

int spn_ncnn_to_onnx(const char *param_path, const char *bin_path, uint8_t **out, size_t *out_len, char *msg,
                     size_t msz) {
  conv_t c = {.param_path = param_path, .bin_path = bin_path, .msg = msg, .msz = msz};
  size_t plen = 0;
  int rc = -1;
  char *text = (char *)read_file(param_path, &plen, msg, msz);
  uint8_t *bin = NULL;
  if (!text)
    return -1;
  if (!(bin = read_file(bin_path, &c.bin_len, msg, msz)))
    goto done;
  c.bin = bin;
  if (convert_text(&c, text, plen))
    goto done;
  c.line = 0;
  if (c.bin_pos != c.bin_len) {
    fail(&c, "%s: %zu bytes left over after the last weight: the .param does not describe this .bin",
         bin_path, c.bin_len - c.bin_pos);
    goto done;
  }
  if (!c.input_count) {
    fail(&c, "%s: no Input layer", param_path);
    goto done;
  }
  /* The graph output: the one blob no layer reads. */
  long out_blob = -1;
  for (size_t i = 0; i < c.n_blobs; i++) {
    if (c.blob_uses[i] || !strcmp(c.blob_onnx[i], "input"))
      continue;
    bool alias_used = false; /* an unused Split output aliases a used value */
    for (size_t j = 0; j < c.n_blobs; j++)
      if (j != i && c.blob_uses[j] && !strcmp(c.blob_onnx[j], c.blob_onnx[i]))
        alias_used = true;
    if (alias_used)
      continue;
    if (out_blob >= 0) {
      fail(&c, "%s: more than one output (blobs '%s' and '%s'); only single-output models are supported",
           param_path, c.blob_ncnn[out_blob], c.blob_ncnn[i]);
      goto done;
    }
    out_blob = (long)i;
  }
  if (out_blob < 0) {
    fail(&c, "%s: no output blob", param_path);
    goto done;
  }
  /* Rename the output value to "output" wherever it is produced or read. */
  const char *oname = c.blob_onnx[out_blob];
  for (size_t i = 0; i < c.n_nodes; i++)
    for (size_t k = 0; k < c.nodes[i]->n_output; k++)
      if (!strcmp(c.nodes[i]->output[k], oname))
        c.nodes[i]->output[k] = "output";

  /* value infos: input (1,3,height,width) float, output (1,3,?,?) float */
  SpnOnnx__TensorShapeProto__Dimension dims[2][4];
  SpnOnnx__TensorShapeProto__Dimension *dimp[2][4];
  SpnOnnx__TensorShapeProto shape[2];
  SpnOnnx__TypeProto__Tensor tt[2];
  SpnOnnx__TypeProto type[2];
  SpnOnnx__ValueInfoProto vi[2], *vip[2];
  static const char *const dparams[2][4] = {{"batch", NULL, "height", "width"},
                                            {"batch", NULL, "out_height", "out_width"}};
  for (int k = 0; k < 2; k++) {
    for (int d = 0; d < 4; d++) {
      dims[k][d] = (SpnOnnx__TensorShapeProto__Dimension)SPN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT;
      if (dparams[k][d]) {
        dims[k][d].value_case = SPN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
        dims[k][d].dim_param = (char *)dparams[k][d];
      } else {
        dims[k][d].value_case = SPN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        dims[k][d].dim_value = 3;
      }
      dimp[k][d] = &dims[k][d];
    }
    shape[k] = (SpnOnnx__TensorShapeProto)SPN_ONNX__TENSOR_SHAPE_PROTO__INIT;
    shape[k].n_dim = 4;
    shape[k].dim = dimp[k];
    tt[k] = (SpnOnnx__TypeProto__Tensor)SPN_ONNX__TYPE_PROTO__TENSOR__INIT;
    tt[k].has_elem_type = 1;
    tt[k].elem_type = 1;
    tt[k].shape = &shape[k];
    type[k] = (SpnOnnx__TypeProto)SPN_ONNX__TYPE_PROTO__INIT;
    type[k].value_case = SPN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    type[k].tensor_type = &tt[k];
    vi[k] = (SpnOnnx__ValueInfoProto)SPN_ONNX__VALUE_INFO_PROTO__INIT;
    vi[k].name = k ? "output" : "input";
    vi[k].type = &type[k];
    vip[k] = &vi[k];
  }
  SpnOnnx__GraphProto g = SPN_ONNX__GRAPH_PROTO__INIT;
  g.name = "ncnn";
  g.n_node = c.n_nodes;
  g.node = c.nodes;
  g.n_initializer = c.n_inits;
  g.initializer = c.inits;
  g.n_input = 1;
  g.input = &vip[0];
  g.n_output = 1;
  g.output = &vip[1];
  SpnOnnx__OperatorSetIdProto opset = SPN_ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsetp = &opset;
  opset.domain = "";
  opset.has_version = 1;
  opset.version = 13;
  SpnOnnx__ModelProto m = SPN_ONNX__MODEL_PROTO__INIT;
  m.has_ir_version = 1;
  m.ir_version = 7;
  m.producer_name = "spindle-ncnn-onnx";
  m.graph = &g;
  m.n_opset_import = 1;
  m.opset_import = &opsetp;
  size_t n = spn_onnx__model_proto__get_packed_size(&m);
  if (!(*out = malloc(n ? n : 1))) {
    snprintf(msg, msz, "out of memory");
    goto done;
  }
  *out_len = spn_onnx__model_proto__pack(&m, *out);
  rc = 0;
done:
  free(text);
  free(bin);
  free(c.blob_ncnn);
  free(c.blob_onnx);
  free(c.blob_uses);
  free(c.nodes);
  free(c.inits);
  arena_free(&c);
  return rc;
}
