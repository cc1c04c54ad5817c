/* plan.c — placement of nodes on backends, node preparation and the values
 * that cross between backends.
 *
 * Every live node that does real work goes to the backend of the model's
 * device when that backend supports it; otherwise to the CPU, which runs
 * every operator (one load-time line names the nodes that fell back), or,
 * with fallback "error", the load fails naming the first such node and its
 * op. Shape-class nodes are evaluated on the host during shape inference
 * and stay with the CPU. Each placed node is then prepared by its backend.
 * Finally every value read by a node whose backend cannot address the
 * value's memory becomes a boundary (spn_cross_t): the run copies it once,
 * at the start of the range of nodes (on that backend) holding its first
 * reader there, into that backend's arena.
 * Constants are not boundaries: a backend's prepare() places the constants
 * its nodes read in its own buffers.
 * Views (Reshape and the like) share their input's bytes, and on the CPU a
 * convolution may write its output over its residual addend; both are
 * vals[].alias, which the arena planner gives no bytes of its own and whose
 * root value it keeps alive until the last of them is read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-internal.h"

static int value_home(const spn_model_t *m, int vi) {
  const spn_value_t *v = &m->vals[vi];
  if (v->kind != SPN_VAL_INTER || v->producer < 0 || m->nodes[v->producer].shape_class)
    return SPN_BACKEND_CPU;
  return m->nodes[v->producer].backend;
}

static int32_t add_cross(spn_model_t *m, int vi, int slot, int node, spn_error_t *err) {
  for (int c = 0; c < m->n_cross; c++)
    if (m->cross[c].val == vi && m->cross[c].slot == slot) {
      m->cross[c].last = node;
      return SPN_OK;
    }
  spn_cross_t *nc = realloc(m->cross, (size_t)(m->n_cross + 1) * sizeof *nc);
  if (!nc)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  m->cross = nc;
  m->cross[m->n_cross++] = (spn_cross_t){.val = vi, .slot = slot, .first = node, .last = node};
  return SPN_OK;
}

int32_t spn_plan_place(spn_model_t *m, spn_error_t *err) {
  spn_backend_t *const *bk = m->shared->backends;
  spn_backend_t *dev = bk[m->dev_slot];
  m->n_fallback = 0;
  /* The load-time line: "... N nodes run on the CPU: a (Op), b (Op), ..." */
  char names[768];
  size_t used = 0;
  names[0] = 0;
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    n->backend = SPN_BACKEND_CPU;
    if (n->dead || n->shape_class || m->dev_slot == SPN_BACKEND_CPU)
      continue;
    char why[160] = "";
    if (dev->iface->supports(dev, m, n, why, sizeof why)) {
      n->backend = m->dev_slot;
      continue;
    }
    if (m->fallback_error)
      return spn_error_set(err, SPN_EUNSUPPORTED, "%s: node '%s' (%s) cannot run on %s%s%s, and fallback is \"error\"", m->path, n->name, n->op_name, dev->device, why[0] ? ": " : "", why);
    m->n_fallback++;
    if (used < sizeof names - 1) {
      int k = snprintf(names + used, sizeof names - used, "%s%s (%s)", used ? ", " : "", n->name, n->op_name);
      used = k < 0 ? used : used + (size_t)k;
      if (used >= sizeof names - 1)
        snprintf(names + sizeof names - 5, 5, "...");
    }
  }
  if (m->n_fallback)
    fprintf(stderr, "spindle engine: %s on %s: %d node%s run on the CPU (not supported by the %s backend): %s\n", m->path, dev->device, m->n_fallback, m->n_fallback == 1 ? "" : "s", dev->device, names);
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class)
      continue;
    spn_backend_t *b = bk[n->backend];
    int32_t rc;
    if (b->iface->prepare && (rc = b->iface->prepare(b, m, n, err)))
      return spn_error_prefix(err, "%s: node '%s' (%s) on %s", m->path, n->name, n->op_name, b->device);
  }
  free(m->cross);
  m->cross = NULL;
  m->n_cross = 0;
  for (int i = 0; i < m->n_node; i++) {
    spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class)
      continue;
    spn_backend_t *b = bk[n->backend];
    for (int k = 0; k < n->n_in + n->n_post; k++) {
      int vi = spn_node_operand(n, k);
      if (vi < 0 || m->vals[vi].kind == SPN_VAL_CONST)
        continue;
      int h = value_home(m, vi);
      if (h == n->backend || (bk[h]->host_memory && b->host_memory))
        continue;
      if (n->backend != SPN_BACKEND_CPU && vi >= 0 && m->vals[vi].kind == SPN_VAL_INTER && m->vals[vi].producer >= 0 &&
          m->nodes[m->vals[vi].producer].shape_class)
        continue; /* shape-class values stay on the host: a device backend reads them there (shapes, scales, pads) and refuses in supports() a node that would read one as device data */
      int32_t rc = add_cross(m, vi, n->backend, i, err);
      if (rc)
        return rc;
    }
  }
  /* A run copies every boundary value of a range of nodes on one backend
   * before the range starts, so each copy's arena slot lives from there. */
  for (int c = 0; c < m->n_cross; c++) {
    int f = m->cross[c].first, start = f;
    for (int i = f - 1; i >= 0; i--) {
      const spn_node_t *n = &m->nodes[i];
      if (n->dead || n->shape_class)
        continue;
      if (n->backend != m->cross[c].slot)
        break;
      start = i;
    }
    m->cross[c].first = start;
  }
  return SPN_OK;
}

static bool is_view_op(int op) {
  return op == SPN_OP_RESHAPE || op == SPN_OP_FLATTEN || op == SPN_OP_SQUEEZE || op == SPN_OP_UNSQUEEZE ||
         op == SPN_OP_IDENTITY;
}

void spn_plan_views(spn_model_t *m) {
  for (int i = 0; i < m->n_val; i++)
    m->vals[i].alias = -1;
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || !is_view_op(n->op) || n->n_in < 1 || n->n_out < 1 || n->in[0] < 0 ||
        n->out[0] < 0)
      continue;
    int x = n->in[0], y = n->out[0];
    const spn_value_t *xv = &m->vals[x];
    spn_value_t *yv = &m->vals[y];
    /* Graph outputs are written to the caller's buffer; an input, constant
     * or shape-class value is not in the arena; a value of another backend
     * reaches this one by a boundary copy; a channels-last value has another
     * layout than its shape says. */
    if (yv->is_output || xv->kind != SPN_VAL_INTER || xv->producer < 0 || xv->nhwc || yv->nhwc ||
        m->nodes[xv->producer].shape_class || value_home(m, x) != n->backend)
      continue;
    yv->alias = xv->alias >= 0 ? xv->alias : x;
  }
}

/* The bytes a value lives in: its own, or those of the value it is a view of. */
static int bytes_root(const spn_model_t *m, int vi) {
  return m->vals[vi].alias >= 0 ? m->vals[vi].alias : vi;
}

void spn_plan_inplace(spn_model_t *m) {
  if (m->dev_slot != SPN_BACKEND_CPU)
    return;
  int late_sum = -1; /* spn_cpu_dnnl_late_sum, asked once, when needed */
  for (int i = 0; i < m->n_node; i++) {
    const spn_node_t *n = &m->nodes[i];
    if (n->dead || n->shape_class || n->backend != SPN_BACKEND_CPU || n->op != SPN_OP_CONV || n->n_out != 1 ||
        n->out[0] < 0 || m->vals[n->in[1]].ndim != 4)
      continue;
    int p = 0;
    while (p < n->n_post && n->post[p].kind != SPN_POST_ADD)
      p++;
    if (p == n->n_post)
      continue;
    /* After other fused post-ops (RRDBNet's conv * 0.2 + x) the in-place
     * sum needs a oneDNN kernel that takes a late sum; without one the Add
     * reads its own buffer. After a PRelu (never fused) the posts run in C
     * and the addend's bytes are copied first, on any CPU. */
    bool late = p > 0;
    for (int q = 0; q < p; q++)
      if (n->post[q].kind == SPN_POST_PRELU)
        late = false;
    if (late && late_sum < 0)
      late_sum = spn_cpu_dnnl_late_sum(m);
    if (late && !late_sum)
      continue;
    int y = n->out[0], a = n->post[p].val;
    const spn_value_t *yv = &m->vals[y], *av = &m->vals[a];
    /* The output is written to the caller's buffer when it is a graph
     * output; both must be channels-last (only there can oneDNN add the
     * addend as a sum: elsewhere the output is reordered after the
     * primitive, and writing in place would only cost a copy); the addend
     * must be an arena value of this backend, its bytes not used after this
     * node by anyone (the views sharing them included), and read by this
     * node only as that addend (the convolution must not read what it
     * overwrites). */
    if (yv->is_output || yv->alias >= 0 || !yv->nhwc || !av->nhwc || av->kind != SPN_VAL_INTER ||
        av->producer < 0 || m->nodes[av->producer].shape_class || value_home(m, a) != SPN_BACKEND_CPU)
      continue;
    int root = bytes_root(m, a);
    bool ok = !m->vals[root].is_output && m->vals[root].kind == SPN_VAL_INTER;
    for (int vi = 0; vi < m->n_val && ok; vi++)
      if (bytes_root(m, vi) == root && (m->vals[vi].is_output || m->vals[vi].last_use > i))
        ok = false;
    int reads = 0;
    for (int k = 0; k < n->n_in && ok; k++)
      if (n->in[k] >= 0 && bytes_root(m, n->in[k]) == root)
        reads++;
    for (int q = 0; q < n->n_post && ok; q++)
      if ((n->post[q].kind == SPN_POST_ADD || n->post[q].kind == SPN_POST_PRELU) && bytes_root(m, n->post[q].val) == root)
        reads++;
    /* A view of the output would point at an alias (views are planned
     * first); none exists while the output is channels-last, but the
     * planner's invariant (an alias is never itself viewed) is kept here. */
    for (int vi = 0; vi < m->n_val && ok; vi++)
      if (m->vals[vi].alias == y)
        ok = false;
    if (!ok || reads != 1)
      continue;
    m->vals[y].alias = root;
  }
}
