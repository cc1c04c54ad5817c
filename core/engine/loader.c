/* loader.c — ONNX protobuf to the engine's graph.
 *
 * Parses the model with protobuf-c (schema subset in onnx.proto), checks the
 * opset, converts initializers (inline raw/typed data or external data files
 * confined to the model's folder) into constant values, and nodes into
 * spn_node_t with their attributes checked against each operator's allowed
 * list and expected types. Every error names the file and the node, tensor or
 * attribute at fault. Hostile sizes are bounded before anything is allocated.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"
#include "onnx.pb-c.h"

const char *const spn_op_names[SPN_OP_COUNT] = {
#define SPN__OPN(e, n, a) n,
    SPN_OP_MAP(SPN__OPN)
#undef SPN__OPN
};

static const char *const op_attrs[SPN_OP_COUNT] = {
#define SPN__OPA(e, n, a) a,
    SPN_OP_MAP(SPN__OPA)
#undef SPN__OPA
};

/* Largest tensor we accept: 2^34 elements (64 GiB of float), and any single
 * dimension at most 2^31. Anything bigger is a corrupt or hostile file. */
#define SPN_MAX_ELEMS (INT64_C(1) << 34)
#define SPN_MAX_DIM (INT64_C(1) << 31)

void *spn_aligned_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes == 0)
    bytes = 64;
  if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63))
    return NULL;
  return p;
}

int spn_model_find_value(const spn_model_t *m, const char *name) {
  for (int i = 0; i < m->n_val; i++)
    if (!strcmp(m->vals[i].name, name))
      return i;
  return -1;
}

int spn_model_add_value(spn_model_t *m, const char *name, spn_error_t *err) {
  if (m->n_val == m->cap_val) {
    int cap = m->cap_val ? m->cap_val * 2 : 64;
    spn_value_t *nv = realloc(m->vals, (size_t)cap * sizeof *nv);
    if (!nv)
      return spn_error_set(err, SPN_ENOMEM, "out of memory growing the value table"), -1;
    m->vals = nv;
    m->cap_val = cap;
  }
  spn_value_t *v = &m->vals[m->n_val];
  memset(v, 0, sizeof *v);
  v->name = strdup(name ? name : "");
  if (!v->name)
    return spn_error_set(err, SPN_ENOMEM, "out of memory"), -1;
  v->ndim = -1;
  v->producer = -1;
  v->last_use = -1;
  v->alias = -1;
  return m->n_val++;
}

void spn_node_attrs_free(spn_node_t *n) {
  for (int a = 0; a < n->n_attr; a++) {
    free(n->attrs[a].name);
    free(n->attrs[a].s);
    free(n->attrs[a].ints);
    free(n->attrs[a].floats);
  }
  free(n->attrs);
  n->attrs = NULL;
  n->n_attr = 0;
}

const spn_attr_t *spn_node_attr(const spn_node_t *n, const char *name) {
  for (int i = 0; i < n->n_attr; i++)
    if (!strcmp(n->attrs[i].name, name))
      return &n->attrs[i];
  return NULL;
}

int64_t spn_attr_int(const spn_node_t *n, const char *name, int64_t def) {
  const spn_attr_t *a = spn_node_attr(n, name);
  return a && a->type == SPN_ATTR_I ? a->i : def;
}

float spn_attr_float(const spn_node_t *n, const char *name, float def) {
  const spn_attr_t *a = spn_node_attr(n, name);
  return a && a->type == SPN_ATTR_F ? a->f : def;
}

const char *spn_attr_str(const spn_node_t *n, const char *name, const char *def) {
  const spn_attr_t *a = spn_node_attr(n, name);
  return a && a->type == SPN_ATTR_S ? a->s : def;
}

static int32_t map_dtype(int32_t onnx) {
  switch (onnx) {
  case 1: return SPN_DTYPE_F32;
  case 2: return SPN_DTYPE_U8;
  case 3: return SPN_DTYPE_I8;
  case 6: return SPN_DTYPE_I32;
  case 7: return SPN_DTYPE_I64;
  case 9: return SPN_DTYPE_BOOL;
  default: return SPN_DTYPE_INVALID;
  }
}

static const char *onnx_dtype_name(int32_t t) {
  static const char *const names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16",
                                      "int32", "int64", "string", "bool", "float16", "double",
                                      "uint32", "uint64", "complex64", "complex128", "bfloat16"};
  return t >= 0 && t < (int32_t)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

/* Read `len` bytes at `off` of an external data file named `loc`, which
 * must be a relative path inside `dir`. */
static int32_t read_external(const char *file, const char *tname, const char *dir,
                             const char *loc, int64_t off, int64_t len, void *dst,
                             spn_error_t *err) {
  if (!dir)
    return spn_error_set(err, SPN_EPERM, "%s: tensor '%s': external data is not allowed for a model loaded from memory", file, tname);
  if (!loc || !*loc || loc[0] == '/' || strstr(loc, ".."))
    return spn_error_set(err, SPN_EPERM, "%s: tensor '%s': external data location '%s' must be a relative path inside the model's folder", file, tname, loc ? loc : "");
  char path[PATH_MAX], real[PATH_MAX], realdir[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/%s", dir, loc) >= (int)sizeof path)
    return spn_error_set(err, SPN_EINVAL, "%s: tensor '%s': external data path too long", file, tname);
  if (!realpath(dir, realdir) || !realpath(path, real))
    return spn_error_set(err, SPN_ENOENT, "%s: tensor '%s': external data file '%s': %s", file, tname, loc, strerror(errno));
  size_t dl = strlen(realdir);
  if (strncmp(real, realdir, dl) || real[dl] != '/')
    return spn_error_set(err, SPN_EPERM, "%s: tensor '%s': external data file '%s' resolves outside the model's folder", file, tname, loc);
  FILE *f = fopen(real, "rb");
  if (!f)
    return spn_error_set(err, SPN_ENOENT, "%s: tensor '%s': cannot open external data '%s': %s", file, tname, loc, strerror(errno));
  int32_t rc = SPN_OK;
  if (fseeko(f, 0, SEEK_END) || ftello(f) < off + len) {
    rc = spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': external data '%s' is shorter than offset %lld + length %lld", file, tname, loc, (long long)off, (long long)len);
  } else if (fseeko(f, off, SEEK_SET) || fread(dst, 1, (size_t)len, f) != (size_t)len) {
    rc = spn_error_set(err, SPN_EIO, "%s: tensor '%s': reading external data '%s' failed", file, tname, loc);
  }
  fclose(f);
  return rc;
}

/* Convert a TensorProto into value `vi` (constant). */
static int32_t load_tensor(spn_model_t *m, int vi, const SpnOnnx__TensorProto *t, const char *dir,
                           bool count, spn_error_t *err) {
  const char *file = m->path;
  const char *tname = t->name ? t->name : "";
  spn_value_t *v = &m->vals[vi];
  int32_t dt = map_dtype(t->data_type);
  if (dt == SPN_DTYPE_INVALID)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: tensor '%s': data type %s (%d) is not supported", file, tname, onnx_dtype_name(t->data_type), t->data_type);
  if (t->n_dims > SPN_MAXD)
    return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': %zu dimensions (at most %d)", file, tname, t->n_dims, SPN_MAXD);
  int64_t numel = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0 || t->dims[i] > SPN_MAX_DIM)
      return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': dimension %zu has invalid size %lld", file, tname, i, (long long)t->dims[i]);
    numel *= t->dims[i];
    if (numel > SPN_MAX_ELEMS)
      return spn_error_set(err, SPN_ETOOBIG, "%s: tensor '%s': too many elements", file, tname);
    v->shape[i] = t->dims[i];
  }
  v->ndim = (int)t->n_dims;
  v->dtype = dt;
  v->kind = SPN_VAL_CONST;
  size_t es = spn_dtype_size(dt);
  size_t bytes = (size_t)numel * es;
  const char *loc = NULL;
  int64_t off = 0, len = -1;
  bool external = t->has_data_location && t->data_location == SPN_ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  if (external) {
    for (size_t i = 0; i < t->n_external_data; i++) {
      const char *k = t->external_data[i]->key, *val = t->external_data[i]->value;
      if (!k || !val)
        continue;
      char *end;
      if (!strcmp(k, "location"))
        loc = val;
      else if (!strcmp(k, "offset") || !strcmp(k, "length")) {
        errno = 0;
        long long x = strtoll(val, &end, 10);
        if (errno || *end || x < 0)
          return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': external data %s '%s' is not a non-negative integer", file, tname, k, val);
        if (!strcmp(k, "offset"))
          off = x;
        else
          len = x;
      }
    }
    if (len >= 0 && (size_t)len != bytes)
      return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': external data length %lld, expected %zu bytes", file, tname, (long long)len, bytes);
    if (off > INT64_MAX / 2)
      return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': external data offset out of range", file, tname);
  } else {
    /* Check the inline payload size before allocating. */
    size_t have;
    if (t->has_raw_data)
      have = t->raw_data.len / es, bytes = (t->raw_data.len == bytes) ? bytes : (size_t)-1;
    else if (dt == SPN_DTYPE_F32)
      have = t->n_float_data;
    else if (dt == SPN_DTYPE_I64)
      have = t->n_int64_data;
    else
      have = t->n_int32_data;
    if (bytes == (size_t)-1)
      return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': raw_data has %zu bytes, shape needs %lld x %zu", file, tname, t->raw_data.len, (long long)numel, es);
    if ((int64_t)have != numel)
      return spn_error_set(err, SPN_EMODEL, "%s: tensor '%s': holds %zu elements, shape needs %lld", file, tname, have, (long long)numel);
  }
  v->data = spn_aligned_alloc(bytes);
  if (!v->data)
    return spn_error_set(err, SPN_ENOMEM, "%s: tensor '%s': out of memory for %zu bytes", file, tname, bytes);
  if (external && count && dt == SPN_DTYPE_F32)
    m->params += numel;
  if (external)
    return read_external(file, tname, dir, loc, off, (int64_t)bytes, v->data, err);
  if (bytes == 0) {
    /* empty tensor: nothing to copy (the payload pointers may be NULL) */
  } else if (t->has_raw_data) {
    memcpy(v->data, t->raw_data.data, bytes);
  } else if (dt == SPN_DTYPE_F32) {
    memcpy(v->data, t->float_data, bytes);
  } else if (dt == SPN_DTYPE_I64) {
    memcpy(v->data, t->int64_data, bytes);
  } else {
    for (int64_t i = 0; i < numel; i++) {
      int32_t x = t->int32_data[i];
      switch (dt) {
      case SPN_DTYPE_I32: ((int32_t *)v->data)[i] = x; break;
      default: ((uint8_t *)v->data)[i] = (uint8_t)x; break;
      }
    }
  }
  if (dt == SPN_DTYPE_F32 && count)
    m->params += numel;
  return SPN_OK;
}

static int expected_attr_type(int op, const char *name) {
  static const struct { const char *n; int t; } tab[] = {
      {"auto_pad", SPN_ATTR_S}, {"dilations", SPN_ATTR_IS}, {"group", SPN_ATTR_I},
      {"kernel_shape", SPN_ATTR_IS}, {"pads", SPN_ATTR_IS}, {"strides", SPN_ATTR_IS},
      {"output_padding", SPN_ATTR_IS}, {"output_shape", SPN_ATTR_IS}, {"epsilon", SPN_ATTR_F},
      {"momentum", SPN_ATTR_F}, {"training_mode", SPN_ATTR_I}, {"spatial", SPN_ATTR_I},
      {"alpha", SPN_ATTR_F}, {"beta", SPN_ATTR_F}, {"min", SPN_ATTR_F}, {"max", SPN_ATTR_F},
      {"axis", SPN_ATTR_I}, {"split", SPN_ATTR_IS}, {"num_outputs", SPN_ATTR_I},
      {"blocksize", SPN_ATTR_I}, {"mode", SPN_ATTR_S},
      {"coordinate_transformation_mode", SPN_ATTR_S}, {"cubic_coeff_a", SPN_ATTR_F},
      {"exclude_outside", SPN_ATTR_I}, {"extrapolation_value", SPN_ATTR_F},
      {"nearest_mode", SPN_ATTR_S}, {"scales", SPN_ATTR_FS}, {"perm", SPN_ATTR_IS},
      {"allowzero", SPN_ATTR_I}, {"axes", SPN_ATTR_IS}, {"ceil_mode", SPN_ATTR_I},
      {"storage_order", SPN_ATTR_I}, {"count_include_pad", SPN_ATTR_I},
      {"value_float", SPN_ATTR_F}, {"value_floats", SPN_ATTR_FS}, {"value_int", SPN_ATTR_I},
      {"value_ints", SPN_ATTR_IS}, {"starts", SPN_ATTR_IS}, {"ends", SPN_ATTR_IS},
      {"to", SPN_ATTR_I}, {"saturate", SPN_ATTR_I}, {"transA", SPN_ATTR_I},
      {"transB", SPN_ATTR_I}, {"keepdims", SPN_ATTR_I}, {"noop_with_empty_axes", SPN_ATTR_I},
      {"start", SPN_ATTR_I}, {"end", SPN_ATTR_I},
  };
  if (!strcmp(name, "value"))
    return op == SPN_OP_PAD ? SPN_ATTR_F : SPN_ATTR_T;
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (!strcmp(tab[i].n, name))
      return tab[i].t;
  return 0;
}

static bool attr_allowed(int op, const char *name) {
  const char *list = op_attrs[op];
  size_t nl = strlen(name);
  while (*list) {
    const char *comma = strchr(list, ',');
    size_t l = comma ? (size_t)(comma - list) : strlen(list);
    if (l == nl && !strncmp(list, name, l))
      return true;
    if (!comma)
      break;
    list = comma + 1;
  }
  return false;
}

static const char *attr_type_name(int t) {
  switch (t) {
  case 1: return "float";
  case 2: return "int";
  case 3: return "string";
  case 4: return "tensor";
  case 5: return "graph";
  case 6: return "floats";
  case 7: return "ints";
  case 8: return "strings";
  default: return "other";
  }
}

static int32_t load_node(spn_model_t *m, int idx, const SpnOnnx__NodeProto *np, spn_error_t *err) {
  const char *file = m->path;
  spn_node_t *n = &m->nodes[idx];
  memset(n, 0, sizeof *n);
  char fallback[32];
  snprintf(fallback, sizeof fallback, "#%d", idx);
  n->name = strdup(np->name && *np->name ? np->name : fallback);
  n->op_name = strdup(np->op_type ? np->op_type : "");
  if (!n->name || !n->op_name)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  n->op = -1;
  if (!np->domain || !*np->domain || !strcmp(np->domain, "ai.onnx"))
    for (int o = 0; o < SPN_OP_FILE_COUNT; o++)
      if (!strcmp(spn_op_names[o], n->op_name))
        n->op = o;
  if (n->op < 0)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (#%d): unsupported operator '%s%s%s'", file, n->name, idx, np->domain && *np->domain ? np->domain : "", np->domain && *np->domain ? "." : "", n->op_name);
  if (np->n_input > 64 || np->n_output > 64)
    return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): too many inputs or outputs", file, n->name, n->op_name);
  n->in = calloc(np->n_input + 1, sizeof(int));
  n->out = calloc(np->n_output + 1, sizeof(int));
  n->attrs = calloc(np->n_attribute + 1, sizeof(spn_attr_t));
  if (!n->in || !n->out || !n->attrs)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  n->n_in = (int)np->n_input;
  for (size_t i = 0; i < np->n_input; i++) {
    const char *nm = np->input[i];
    if (!nm || !*nm) {
      n->in[i] = -1;
      continue;
    }
    int vi = spn_model_find_value(m, nm);
    if (vi < 0 && (vi = spn_model_add_value(m, nm, err)) < 0)
      return err ? err->code : SPN_ENOMEM;
    n->in[i] = vi;
  }
  n->n_out = (int)np->n_output;
  for (size_t i = 0; i < np->n_output; i++) {
    const char *nm = np->output[i];
    if (!nm || !*nm) {
      n->out[i] = -1;
      continue;
    }
    int vi = spn_model_find_value(m, nm);
    if (vi < 0 && (vi = spn_model_add_value(m, nm, err)) < 0)
      return err ? err->code : SPN_ENOMEM;
    if (m->vals[vi].producer >= 0 || m->vals[vi].kind != SPN_VAL_INTER)
      return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): output '%s' is already produced elsewhere", file, n->name, n->op_name, nm);
    m->vals[vi].producer = idx;
    n->out[i] = vi;
  }
  for (size_t i = 0; i < np->n_attribute; i++) {
    const SpnOnnx__AttributeProto *ap = np->attribute[i];
    spn_attr_t *a = &n->attrs[n->n_attr];
    const char *an = ap->name ? ap->name : "";
    if (!attr_allowed(n->op, an))
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s): unsupported attribute '%s'", file, n->name, n->op_name, an);
    int want = expected_attr_type(n->op, an);
    int have = ap->has_type ? (int)ap->type : 0;
    if (have == 0) { /* very old files: infer from the payload */
      if (ap->t) have = SPN_ATTR_T;
      else if (ap->n_ints) have = SPN_ATTR_IS;
      else if (ap->n_floats) have = SPN_ATTR_FS;
      else if (ap->has_s) have = SPN_ATTR_S;
      else if (ap->has_i) have = SPN_ATTR_I;
      else if (ap->has_f) have = SPN_ATTR_F;
    }
    if (have != want)
      return spn_error_set(err, SPN_ETYPE, "%s: node '%s' (%s): attribute '%s' has type %s, expected %s", file, n->name, n->op_name, an, attr_type_name(have), attr_type_name(want));
    a->name = strdup(an);
    if (!a->name)
      return spn_error_set(err, SPN_ENOMEM, "out of memory");
    n->n_attr++;
    a->type = have;
    a->tval = -1;
    switch (have) {
    case SPN_ATTR_F: a->f = ap->f; break;
    case SPN_ATTR_I: a->i = ap->i; break;
    case SPN_ATTR_S:
      a->s = malloc(ap->s.len + 1);
      if (!a->s)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      if (ap->s.len)
        memcpy(a->s, ap->s.data, ap->s.len);
      a->s[ap->s.len] = 0;
      break;
    case SPN_ATTR_IS:
      a->n = (int64_t)ap->n_ints;
      a->ints = malloc((ap->n_ints + 1) * sizeof(int64_t));
      if (!a->ints)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      if (ap->n_ints)
        memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
      break;
    case SPN_ATTR_FS:
      a->n = (int64_t)ap->n_floats;
      a->floats = malloc((ap->n_floats + 1) * sizeof(float));
      if (!a->floats)
        return spn_error_set(err, SPN_ENOMEM, "out of memory");
      if (ap->n_floats)
        memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
      break;
    case SPN_ATTR_T: {
      if (!ap->t)
        return spn_error_set(err, SPN_EMODEL, "%s: node '%s' (%s): attribute '%s' has no tensor", file, n->name, n->op_name, an);
      char tn[300];
      snprintf(tn, sizeof tn, "%s/%s", n->name, an);
      int vi = spn_model_add_value(m, tn, err);
      if (vi < 0)
        return err ? err->code : SPN_ENOMEM;
      int32_t rc = load_tensor(m, vi, ap->t, NULL, false, err);
      if (rc)
        return spn_error_prefix(err, "node '%s' attribute '%s'", n->name, an);
      a->tval = vi;
      break;
    }
    default: break;
    }
  }
  return SPN_OK;
}

static int32_t load_value_info(spn_model_t *m, int vi, const SpnOnnx__ValueInfoProto *vp,
                               const char *what, spn_error_t *err) {
  spn_value_t *v = &m->vals[vi];
  const SpnOnnx__TypeProto *tp = vp->type;
  if (!tp || tp->value_case != SPN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: %s '%s' is not a tensor", m->path, what, v->name);
  int32_t dt = map_dtype(tp->tensor_type->elem_type);
  if (dt == SPN_DTYPE_INVALID)
    return spn_error_set(err, SPN_EUNSUPPORTED, "%s: %s '%s': data type %s is not supported", m->path, what, v->name, onnx_dtype_name(tp->tensor_type->elem_type));
  v->dtype = dt;
  const SpnOnnx__TensorShapeProto *sp = tp->tensor_type->shape;
  if (!sp) {
    v->ndim = -1;
    return SPN_OK;
  }
  if (sp->n_dim > SPN_MAXD)
    return spn_error_set(err, SPN_EMODEL, "%s: %s '%s': %zu dimensions (at most %d)", m->path, what, v->name, sp->n_dim, SPN_MAXD);
  v->ndim = (int)sp->n_dim;
  for (size_t i = 0; i < sp->n_dim; i++) {
    const SpnOnnx__TensorShapeProto__Dimension *d = sp->dim[i];
    if (d->value_case == SPN_ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
      if (d->dim_value < 0 || d->dim_value > SPN_MAX_DIM)
        return spn_error_set(err, SPN_EMODEL, "%s: %s '%s': dimension %zu has invalid size %lld", m->path, what, v->name, i, (long long)d->dim_value);
      v->shape[i] = d->dim_value;
    } else {
      v->shape[i] = -1;
    }
  }
  return SPN_OK;
}

int32_t spn_onnx_parse(spn_model_t *m, const uint8_t *buf, size_t len, const char *dir,
                       spn_error_t *err) {
  const char *file = m->path;
  SpnOnnx__ModelProto *mp = spn_onnx__model_proto__unpack(NULL, len, buf);
  if (!mp)
    return spn_error_set(err, SPN_EPARSE, "%s: not a valid ONNX protobuf (corrupt or truncated, %zu bytes)", file, len);
  int32_t rc = SPN_OK;
  const SpnOnnx__GraphProto *g = mp->graph;
  if (!g) {
    rc = spn_error_set(err, SPN_EMODEL, "%s: model has no graph", file);
    goto out;
  }
  m->opset = -1;
  for (size_t i = 0; i < mp->n_opset_import; i++) {
    const char *d = mp->opset_import[i]->domain;
    if (!d || !*d || !strcmp(d, "ai.onnx"))
      m->opset = mp->opset_import[i]->version;
  }
  if (m->opset < 11 || m->opset > 17) {
    rc = spn_error_set(err, SPN_EUNSUPPORTED, "%s: default-domain opset %lld is not supported (11 to 17)", file, (long long)m->opset);
    goto out;
  }
  if (g->n_node > 1000000 || g->n_initializer > 1000000 || g->n_input > 4096 || g->n_output > 4096) {
    rc = spn_error_set(err, SPN_ETOOBIG, "%s: graph too large", file);
    goto out;
  }
  for (size_t i = 0; i < g->n_initializer; i++) {
    const SpnOnnx__TensorProto *t = g->initializer[i];
    if (!t->name || !*t->name) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: initializer #%zu has no name", file, i);
      goto out;
    }
    if (spn_model_find_value(m, t->name) >= 0) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: initializer '%s' is defined twice", file, t->name);
      goto out;
    }
    int vi = spn_model_add_value(m, t->name, err);
    if (vi < 0 || (rc = load_tensor(m, vi, t, dir, true, err))) {
      rc = err ? err->code : SPN_EMODEL;
      goto out;
    }
  }
  m->inputs = calloc(g->n_input + 1, sizeof(int));
  m->outputs = calloc(g->n_output + 1, sizeof(int));
  m->dyn_in = calloc(g->n_input + 1, sizeof *m->dyn_in);
  if (!m->inputs || !m->outputs || !m->dyn_in) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < g->n_input; i++) {
    const char *nm = g->input[i]->name;
    if (!nm || !*nm) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: graph input #%zu has no name", file, i);
      goto out;
    }
    int vi = spn_model_find_value(m, nm);
    if (vi >= 0 && m->vals[vi].kind == SPN_VAL_CONST)
      continue; /* old exporters list initializers as inputs too */
    if (vi >= 0) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: graph input '%s' is listed twice", file, nm);
      goto out;
    }
    if ((vi = spn_model_add_value(m, nm, err)) < 0) {
      rc = err ? err->code : SPN_ENOMEM;
      goto out;
    }
    m->vals[vi].kind = SPN_VAL_INPUT;
    if ((rc = load_value_info(m, vi, g->input[i], "input", err)))
      goto out;
    if (m->vals[vi].ndim < 0) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: input '%s' has no shape", file, nm);
      goto out;
    }
    m->inputs[m->n_inputs++] = vi;
  }
  m->nodes = calloc(g->n_node + 1, sizeof(spn_node_t));
  if (!m->nodes) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto out;
  }
  m->cap_node = (int)g->n_node;
  for (size_t i = 0; i < g->n_node; i++) {
    m->n_node = (int)i + 1;
    if ((rc = load_node(m, (int)i, g->node[i], err)))
      goto out;
  }
  for (size_t i = 0; i < g->n_output; i++) {
    const char *nm = g->output[i]->name;
    int vi = nm ? spn_model_find_value(m, nm) : -1;
    if (vi < 0) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: graph output '%s' is not produced by any node", file, nm ? nm : "");
      goto out;
    }
    if (m->vals[vi].is_output) {
      rc = spn_error_set(err, SPN_EMODEL, "%s: graph output '%s' is listed twice", file, nm);
      goto out;
    }
    m->vals[vi].is_output = true;
    if (m->vals[vi].kind == SPN_VAL_INTER && m->vals[vi].producer >= 0) {
      /* Keep the declared shape for inspection; the run infers its own. */
      int32_t dt = m->vals[vi].dtype;
      if (load_value_info(m, vi, g->output[i], "output", err) != SPN_OK) {
        spn_error_clear(err);
        m->vals[vi].dtype = dt;
      }
    }
    m->outputs[m->n_outputs++] = vi;
  }
  if (m->n_outputs == 0)
    rc = spn_error_set(err, SPN_EMODEL, "%s: graph has no outputs", file);
out:
  spn_onnx__model_proto__free_unpacked(mp, NULL);
  return rc;
}

void spn_model_destroy(spn_model_t *m) {
  if (!m)
    return;
  spn_plans_free(m);
  for (int b = 0; m->shared && b < m->shared->n_backends; b++) {
    spn_backend_t *bk = m->shared->backends[b];
    if (bk && bk->iface->model_release)
      bk->iface->model_release(bk, m);
  }
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    spn_backend_t *b = m->shared ? m->shared->backends[n->backend] : NULL;
    if (n->bctx && b && b->iface->node_free)
      b->iface->node_free(b, n);
    if (n->lock_init)
      pthread_mutex_destroy(&n->lock);
    spn_node_attrs_free(n);
    free(n->in);
    free(n->out);
    free(n->name);
    free(n->op_name);
  }
  free(m->nodes);
  for (int i = 0; i < m->n_pool; i++) {
    spn_backend_t *b = m->shared ? m->shared->backends[m->pool[i].slot] : NULL;
    if (b)
      b->iface->buf_free(b, m->pool[i].p, m->pool[i].h);
  }
  free(m->cross);
  if (m->pool_lock_init)
    pthread_mutex_destroy(&m->pool_lock);
  for (int i = 0; i < m->n_val; i++) {
    free(m->vals[i].name);
    free(m->vals[i].data);
  }
  free(m->vals);
  free(m->inputs);
  free(m->outputs);
  free(m->dyn_in);
  free(m->key);
  free(m->path);
  free(m->device);
  free(m);
}
