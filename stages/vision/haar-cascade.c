/* haar-cascade.c — loading OpenCV Haar cascade XML files with libxml2.
 *
 * Two layouts exist. The current one ("opencv-cascade-classifier") lists
 * stages of weak classifiers whose decision trees are flattened into
 * `internalNodes` (left right featureIdx threshold per node; a child <= 0 is
 * the leaf -child) and `leafValues`, plus a shared `features` table. The old
 * one ("opencv-haar-classifier") nests each tree's nodes with their feature
 * inline and left_val/left_node, right_val/right_node children; we convert it
 * to the same flat form while reading, as OpenCV does. Stage thresholds are
 * stored minus 1e-5 (OpenCV's THRESHOLD_EPS) so a window scoring exactly the
 * threshold is rejected the same way.
 *
 * Invariants after a successful load: every node's feature index is in range,
 * every child index stays inside its own tree, every leaf index inside the
 * tree's leaves, every rectangle lies inside the window (so evaluation never
 * reads outside the integral image), and a tree always terminates (children
 * point forward).
 */
#include "haar-internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/parser.h>
#include <libxml/tree.h>

#define HAAR_THRESHOLD_EPS 1e-5f

typedef struct load_ctx {
  const char *name;
  spn_error_t *err;
  spn_haar_cascade_t *c;
  int32_t cap_nodes, cap_leaves, cap_trees, cap_features;
} load_ctx_t;

static int is_elem(const xmlNode *n, const char *name) {
  return n && n->type == XML_ELEMENT_NODE && (!name || xmlStrcmp(n->name, (const xmlChar *)name) == 0);
}

static xmlNode *child(const xmlNode *n, const char *name) {
  for (xmlNode *k = n ? n->children : NULL; k; k = k->next)
    if (is_elem(k, name))
      return k;
  return NULL;
}

static xmlNode *first_elem(const xmlNode *n) {
  return child(n, NULL);
}

static xmlNode *next_elem(const xmlNode *n) {
  for (xmlNode *k = n->next; k; k = k->next)
    if (is_elem(k, NULL))
      return k;
  return NULL;
}

static int32_t fail(load_ctx_t *L, const xmlNode *at, int32_t code, const char *what) {
  return spn_error_set(L->err, code, "%s:%ld: %s", L->name, at ? (long)xmlGetLineNo((xmlNode *)at) : 0L, what);
}

/* Parse up to `max` numbers from an element's text. Returns the count, or -1
 * if something other than numbers and blanks is present. */
static int parse_numbers(const xmlNode *n, double *out, int max) {
  xmlChar *txt = xmlNodeGetContent((xmlNode *)n);
  if (!txt)
    return -1;
  const char *p = (const char *)txt;
  int count = 0;
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
      p++;
    if (!*p)
      break;
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno == ERANGE || !isfinite(v) || count == max) {
      count = -1;
      break;
    }
    out[count++] = v;
    p = end;
  }
  xmlFree(txt);
  return count;
}

static int32_t parse_int(load_ctx_t *L, const xmlNode *n, const char *what, int32_t lo, int32_t hi, int32_t *v) {
  double d;
  char msg[160];
  if (!n || parse_numbers(n, &d, 1) != 1 || d != floor(d) || d < lo || d > hi) {
    snprintf(msg, sizeof msg, "<%s> must be an integer in [%d, %d]", what, lo, hi);
    return fail(L, n, SPN_EPARSE, msg);
  }
  *v = (int32_t)d;
  return SPN_OK;
}

static int32_t parse_float(load_ctx_t *L, const xmlNode *n, const char *what, float *v) {
  double d;
  char msg[160];
  if (!n || parse_numbers(n, &d, 1) != 1) {
    snprintf(msg, sizeof msg, "<%s> must be one number", what);
    return fail(L, n, SPN_EPARSE, msg);
  }
  *v = (float)d;
  return SPN_OK;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  int64_t nc = *cap ? (int64_t)*cap * 2 : 64;
  while (nc < need)
    nc *= 2;
  if (nc > INT32_MAX / 2)
    return -1;
  void *q = realloc(*p, (size_t)nc * elem);
  if (!q)
    return -1;
  *p = q;
  *cap = (int32_t)nc;
  return 0;
}

static int32_t add_node(load_ctx_t *L, const haar_node_t *nd) {
  spn_haar_cascade_t *c = L->c;
  if (grow((void **)&c->nodes, &L->cap_nodes, c->nnodes + 1, sizeof *nd))
    return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
  c->nodes[c->nnodes++] = *nd;
  return SPN_OK;
}

static int32_t add_leaf(load_ctx_t *L, float v) {
  spn_haar_cascade_t *c = L->c;
  if (grow((void **)&c->leaves, &L->cap_leaves, c->nleaves + 1, sizeof v))
    return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
  c->leaves[c->nleaves++] = v;
  return SPN_OK;
}

static int32_t add_tree(load_ctx_t *L, const haar_tree_t *t) {
  spn_haar_cascade_t *c = L->c;
  if (grow((void **)&c->trees, &L->cap_trees, c->ntrees + 1, sizeof *t))
    return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
  c->trees[c->ntrees++] = *t;
  return SPN_OK;
}

/* A <feature> (or an element of <features>): <rects> of "x y w h weight"
 * and an optional <tilted>. */
static int32_t read_feature(load_ctx_t *L, const xmlNode *fn, haar_feature_t *f) {
  spn_haar_cascade_t *c = L->c;
  memset(f, 0, sizeof *f);
  xmlNode *rects = child(fn, "rects");
  if (!rects)
    return fail(L, fn, SPN_EPARSE, "feature without <rects>");
  xmlNode *tn = child(fn, "tilted");
  if (tn) {
    int32_t t;
    int32_t rc = parse_int(L, tn, "tilted", 0, 1, &t);
    if (rc)
      return rc;
    f->tilted = t;
  }
  int nr = 0;
  for (xmlNode *r = first_elem(rects); r; r = next_elem(r)) {
    double v[5];
    if (nr == SPN__HAAR_MAX_RECTS)
      return fail(L, r, SPN_EPARSE, "feature has more than 3 rectangles");
    if (parse_numbers(r, v, 5) != 5)
      return fail(L, r, SPN_EPARSE, "rectangle must be \"x y width height weight\"");
    for (int k = 0; k < 4; k++)
      if (v[k] != floor(v[k]) || v[k] < 0 || v[k] > 4096)
        return fail(L, r, SPN_EPARSE, "rectangle coordinates must be small non-negative integers");
    int32_t x = (int32_t)v[0], y = (int32_t)v[1], w = (int32_t)v[2], h = (int32_t)v[3];
    /* Keep every corner inside the window so evaluation stays inside the
     * integral image. A tilted rectangle spans x-h .. x+w and y .. y+w+h. */
    int ok = f->tilted ? (x - h >= 0 && x + w <= c->win_w && y + w + h <= c->win_h)
                       : (x + w <= c->win_w && y + h <= c->win_h);
    if (!ok)
      return fail(L, r, SPN_EPARSE, "rectangle lies outside the detection window");
    f->r[nr].x = x;
    f->r[nr].y = y;
    f->r[nr].w = w;
    f->r[nr].h = h;
    f->r[nr].weight = (float)v[4];
    nr++;
  }
  if (nr < 2)
    return fail(L, rects, SPN_EPARSE, "feature needs at least 2 rectangles");
  f->nrects = nr;
  return SPN_OK;
}

static int32_t read_header_new(load_ctx_t *L, const xmlNode *root) {
  spn_haar_cascade_t *c = L->c;
  xmlNode *st = child(root, "stageType"), *ft = child(root, "featureType");
  xmlChar *s = st ? xmlNodeGetContent(st) : NULL;
  int boost = s && xmlStrcmp(s, (const xmlChar *)"BOOST") == 0;
  xmlFree(s);
  if (!boost)
    return fail(L, st ? st : root, SPN_EUNSUPPORTED, "only BOOST cascades are supported (<stageType>)");
  s = ft ? xmlNodeGetContent(ft) : NULL;
  int haar = s && xmlStrcmp(s, (const xmlChar *)"HAAR") == 0;
  xmlFree(s);
  if (!haar)
    return fail(L, ft ? ft : root, SPN_EUNSUPPORTED, "only HAAR features are supported (<featureType>)");
  int32_t rc;
  if ((rc = parse_int(L, child(root, "width"), "width", 1, 1024, &c->win_w)) ||
      (rc = parse_int(L, child(root, "height"), "height", 1, 1024, &c->win_h)))
    return rc;
  if (c->win_w < 3 || c->win_h < 3)
    return fail(L, root, SPN_EPARSE, "window must be at least 3x3");
  xmlNode *fp = child(root, "featureParams");
  xmlNode *mc = fp ? child(fp, "maxCatCount") : NULL;
  if (mc) {
    int32_t cats;
    if ((rc = parse_int(L, mc, "maxCatCount", 0, 1 << 20, &cats)))
      return rc;
    if (cats != 0)
      return fail(L, mc, SPN_EUNSUPPORTED, "categorical (LBP-style) splits are not supported");
  }
  return SPN_OK;
}

static int32_t read_new(load_ctx_t *L, const xmlNode *root) {
  spn_haar_cascade_t *c = L->c;
  int32_t rc = read_header_new(L, root);
  if (rc)
    return rc;

  xmlNode *feats = child(root, "features");
  if (!feats)
    return fail(L, root, SPN_EPARSE, "cascade without <features>");
  for (xmlNode *f = first_elem(feats); f; f = next_elem(f)) {
    if (grow((void **)&c->features, &L->cap_features, c->nfeatures + 1, sizeof *c->features))
      return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
    if ((rc = read_feature(L, f, &c->features[c->nfeatures])))
      return rc;
    c->nfeatures++;
  }
  if (c->nfeatures == 0)
    return fail(L, feats, SPN_EPARSE, "cascade has no features");

  xmlNode *stages = child(root, "stages");
  if (!stages)
    return fail(L, root, SPN_EPARSE, "cascade without <stages>");
  int32_t nst = 0;
  for (xmlNode *s = first_elem(stages); s; s = next_elem(s))
    nst++;
  if (nst == 0)
    return fail(L, stages, SPN_EPARSE, "cascade has no stages");
  c->stages = calloc((size_t)nst, sizeof *c->stages);
  if (!c->stages)
    return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);

  for (xmlNode *s = first_elem(stages); s; s = next_elem(s)) {
    haar_stage_t *stg = &c->stages[c->nstages];
    float thr = 0.f;
    if ((rc = parse_float(L, child(s, "stageThreshold"), "stageThreshold", &thr)))
      return rc;
    stg->threshold = thr - HAAR_THRESHOLD_EPS;
    stg->first_tree = c->ntrees;
    xmlNode *weak = child(s, "weakClassifiers");
    if (!weak)
      return fail(L, s, SPN_EPARSE, "stage without <weakClassifiers>");
    for (xmlNode *w = first_elem(weak); w; w = next_elem(w)) {
      xmlNode *in = child(w, "internalNodes"), *lv = child(w, "leafValues");
      if (!in || !lv)
        return fail(L, w, SPN_EPARSE, "weak classifier needs <internalNodes> and <leafValues>");
      double nums[4 * 64], leaves[65];
      int nn = parse_numbers(in, nums, 4 * 64);
      int nl = parse_numbers(lv, leaves, 65);
      if (nn <= 0 || nn % 4 != 0)
        return fail(L, in, SPN_EPARSE, "<internalNodes> must hold 4 numbers per node (at most 64 nodes)");
      int nodes = nn / 4;
      if (nl != nodes + 1)
        return fail(L, lv, SPN_EPARSE, "<leafValues> must hold one more value than there are nodes");
      haar_tree_t t = {.node_count = nodes, .first_node = c->nnodes, .first_leaf = c->nleaves};
      for (int k = 0; k < nodes; k++) {
        double l = nums[4 * k], r = nums[4 * k + 1], fi = nums[4 * k + 2];
        if (l != floor(l) || r != floor(r) || fi != floor(fi))
          return fail(L, in, SPN_EPARSE, "node indices must be integers");
        /* Children: > 0 is a node of this tree after this one (so the walk
         * terminates), <= 0 is leaf -child. */
        if ((l > 0 && (l <= k || l >= nodes)) || (r > 0 && (r <= k || r >= nodes)) ||
            (l <= 0 && -l > nodes) || (r <= 0 && -r > nodes))
          return fail(L, in, SPN_EPARSE, "node child index out of range");
        if (fi < 0 || fi >= c->nfeatures)
          return fail(L, in, SPN_EPARSE, "node feature index out of range");
        haar_node_t nd = {.left = (int32_t)l, .right = (int32_t)r, .feature = (int32_t)fi,
                               .threshold = (float)nums[4 * k + 3]};
        if ((rc = add_node(L, &nd)))
          return rc;
      }
      for (int k = 0; k < nl; k++)
        if ((rc = add_leaf(L, (float)leaves[k])))
          return rc;
      if ((rc = add_tree(L, &t)))
        return rc;
    }
    stg->ntrees = c->ntrees - stg->first_tree;
    if (stg->ntrees == 0)
      return fail(L, s, SPN_EPARSE, "stage has no weak classifiers");
    c->nstages++;
  }
  return SPN_OK;
}

/* Old layout: each tree is a list of nodes with inline features. */
static int32_t read_old_child(load_ctx_t *L, const xmlNode *node, const char *valname, const char *nodename,
                              int32_t k, int32_t nodes, int32_t *leaf_count, int32_t *out) {
  xmlNode *v = child(node, valname), *nn = child(node, nodename);
  int32_t rc;
  if (v) {
    float f = 0.f;
    if ((rc = parse_float(L, v, valname, &f)) || (rc = add_leaf(L, f)))
      return rc;
    *out = -(*leaf_count)++;
    return SPN_OK;
  }
  if (nn) {
    int32_t idx;
    if ((rc = parse_int(L, nn, nodename, 0, 1 << 20, &idx)))
      return rc;
    if (idx <= k || idx >= nodes)
      return fail(L, nn, SPN_EPARSE, "node child index out of range");
    *out = idx;
    return SPN_OK;
  }
  return fail(L, node, SPN_EPARSE, "tree node needs a value or a child node on each side");
}

static int32_t read_old(load_ctx_t *L, const xmlNode *root) {
  spn_haar_cascade_t *c = L->c;
  int32_t rc;
  xmlNode *sz = child(root, "size");
  double wh[2];
  if (!sz || parse_numbers(sz, wh, 2) != 2 || wh[0] != floor(wh[0]) || wh[1] != floor(wh[1]) || wh[0] < 3 ||
      wh[1] < 3 || wh[0] > 1024 || wh[1] > 1024)
    return fail(L, sz ? sz : root, SPN_EPARSE, "<size> must be \"width height\" (3..1024)");
  c->win_w = (int32_t)wh[0];
  c->win_h = (int32_t)wh[1];
  xmlNode *stages = child(root, "stages");
  if (!stages)
    return fail(L, root, SPN_EPARSE, "cascade without <stages>");
  int32_t nst = 0;
  for (xmlNode *s = first_elem(stages); s; s = next_elem(s))
    nst++;
  if (nst == 0)
    return fail(L, stages, SPN_EPARSE, "cascade has no stages");
  c->stages = calloc((size_t)nst, sizeof *c->stages);
  if (!c->stages)
    return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
  for (xmlNode *s = first_elem(stages); s; s = next_elem(s)) {
    haar_stage_t *stg = &c->stages[c->nstages];
    float thr = 0.f;
    if ((rc = parse_float(L, child(s, "stage_threshold"), "stage_threshold", &thr)))
      return rc;
    /* Only chains are supported: the stage tree of old cascades is a list in
     * every file OpenCV ships except the *_tree variants. */
    xmlNode *par = child(s, "parent");
    if (par) {
      int32_t p;
      if ((rc = parse_int(L, par, "parent", -1, INT32_MAX - 1, &p)))
        return rc;
      if (p != c->nstages - 1)
        return fail(L, par, SPN_EUNSUPPORTED, "tree-structured stage cascades are not supported");
    }
    stg->threshold = thr - HAAR_THRESHOLD_EPS;
    stg->first_tree = c->ntrees;
    xmlNode *trees = child(s, "trees");
    if (!trees)
      return fail(L, s, SPN_EPARSE, "stage without <trees>");
    for (xmlNode *t = first_elem(trees); t; t = next_elem(t)) {
      int32_t nodes = 0;
      for (xmlNode *nd = first_elem(t); nd; nd = next_elem(nd))
        nodes++;
      if (nodes == 0 || nodes > 64)
        return fail(L, t, SPN_EPARSE, "tree must have 1..64 nodes");
      haar_tree_t tr = {.node_count = nodes, .first_node = c->nnodes, .first_leaf = c->nleaves};
      int32_t k = 0, leaf_count = 0;
      for (xmlNode *nd = first_elem(t); nd; nd = next_elem(nd), k++) {
        xmlNode *fe = child(nd, "feature");
        if (!fe)
          return fail(L, nd, SPN_EPARSE, "tree node without <feature>");
        if (grow((void **)&c->features, &L->cap_features, c->nfeatures + 1, sizeof *c->features))
          return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
        if ((rc = read_feature(L, fe, &c->features[c->nfeatures])))
          return rc;
        haar_node_t n = {.feature = c->nfeatures++};
        if ((rc = parse_float(L, child(nd, "threshold"), "threshold", &n.threshold)) ||
            (rc = read_old_child(L, nd, "left_val", "left_node", k, nodes, &leaf_count, &n.left)) ||
            (rc = read_old_child(L, nd, "right_val", "right_node", k, nodes, &leaf_count, &n.right)) ||
            (rc = add_node(L, &n)))
          return rc;
      }
      if (leaf_count != nodes + 1)
        return fail(L, t, SPN_EPARSE, "tree must have one more leaf than nodes");
      if ((rc = add_tree(L, &tr)))
        return rc;
    }
    stg->ntrees = c->ntrees - stg->first_tree;
    if (stg->ntrees == 0)
      return fail(L, s, SPN_EPARSE, "stage has no trees");
    c->nstages++;
  }
  return SPN_OK;
}

static int32_t finish(spn_haar_cascade_t *c, load_ctx_t *L) {
  c->max_nodes = 0;
  for (int32_t i = 0; i < c->nfeatures; i++)
    if (c->features[i].tilted)
      c->has_tilted = 1;
  for (int32_t i = 0; i < c->ntrees; i++)
    if (c->trees[i].node_count > c->max_nodes)
      c->max_nodes = c->trees[i].node_count;
  if (c->max_nodes == 1) {
    c->stumps = malloc((size_t)c->ntrees * sizeof *c->stumps);
    if (!c->stumps)
      return spn_error_set(L->err, SPN_ENOMEM, "%s: out of memory", L->name);
    for (int32_t i = 0; i < c->ntrees; i++) {
      const haar_node_t *n = &c->nodes[c->trees[i].first_node];
      const float *lv = &c->leaves[c->trees[i].first_leaf];
      c->stumps[i].feature = n->feature;
      c->stumps[i].threshold = n->threshold;
      c->stumps[i].left = lv[-n->left];
      c->stumps[i].right = lv[-n->right];
    }
  }
  return SPN_OK;
}

int32_t spn_haar_cascade_load_memory(const char *xml, size_t len, const char *name, spn_haar_cascade_t **out,
                                     spn_error_t *err) {
  if (!out)
    return spn_error_set(err, SPN_EINVAL, "haar: NULL output pointer");
  *out = NULL;
  if (!name)
    name = "<memory>";
  if (!xml || len == 0 || len > INT_MAX)
    return spn_error_set(err, SPN_EINVAL, "%s: empty or oversized cascade", name);
  xmlDoc *doc = xmlReadMemory(xml, (int)len, name, NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
  if (!doc) {
    const xmlError *xe = xmlGetLastError();
    return spn_error_set(err, SPN_EPARSE, "%s:%d: not well-formed XML: %s", name, xe ? xe->line : 0,
                         xe && xe->message ? xe->message : "parse error");
  }
  int32_t rc = SPN_OK;
  load_ctx_t L = {.name = name, .err = err};
  spn_haar_cascade_t *c = calloc(1, sizeof *c);
  if (!c) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", name);
    goto out_doc;
  }
  L.c = c;
  xmlNode *top = xmlDocGetRootElement(doc);
  if (!is_elem(top, "opencv_storage")) {
    rc = fail(&L, top, SPN_EPARSE, "root element must be <opencv_storage>");
    goto out_cascade;
  }
  xmlNode *root = first_elem(top);
  if (!root) {
    rc = fail(&L, top, SPN_EPARSE, "<opencv_storage> is empty");
    goto out_cascade;
  }
  if (child(root, "stageType"))
    rc = read_new(&L, root);
  else if (child(root, "size") && child(root, "stages"))
    rc = read_old(&L, root);
  else
    rc = fail(&L, root, SPN_EPARSE, "not a cascade (neither <stageType> nor <size>/<stages>)");
  if (rc == SPN_OK)
    rc = finish(c, &L);
  if (rc)
    goto out_cascade;
  xmlFreeDoc(doc);
  *out = c;
  return SPN_OK;

out_cascade:
  spn_haar_cascade_free(c);
out_doc:
  xmlFreeDoc(doc);
  return rc;
}

int32_t spn_haar_cascade_load(const char *path, spn_haar_cascade_t **out, spn_error_t *err) {
  if (!path || !out)
    return spn_error_set(err, SPN_EINVAL, "haar: NULL path or output pointer");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return spn_error_set(err, SPN_ENOENT, "%s: cannot open: %s", path, strerror(errno));
  int32_t rc = SPN_OK;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    rc = spn_error_set(err, SPN_EIO, "%s: cannot seek", path);
    goto out_file;
  }
  long sz = ftell(f);
  if (sz <= 0 || sz > (64L << 20)) {
    rc = spn_error_set(err, SPN_EPARSE, "%s: empty or larger than 64 MiB", path);
    goto out_file;
  }
  rewind(f);
  buf = malloc((size_t)sz);
  if (!buf) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_file;
  }
  if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    rc = spn_error_set(err, SPN_EIO, "%s: read failed", path);
    goto out_buf;
  }
  rc = spn_haar_cascade_load_memory(buf, (size_t)sz, path, out, err);
out_buf:
  free(buf);
out_file:
  fclose(f);
  return rc;
}

void spn_haar_cascade_free(spn_haar_cascade_t *c) {
  if (!c)
    return;
  free(c->stages);
  free(c->trees);
  free(c->nodes);
  free(c->leaves);
  free(c->features);
  free(c->stumps);
  free(c);
}

void spn_haar_cascade_window(const spn_haar_cascade_t *c, int32_t *w, int32_t *h) {
  if (w)
    *w = c->win_w;
  if (h)
    *h = c->win_h;
}
