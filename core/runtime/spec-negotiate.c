/* spec-negotiate.c — one format per edge, chosen when the pipeline is built
 * (ABI 1.1).
 *
 * Every port has caps (spindle/plugin.h, spn_port_caps_t): the memory kinds
 * it takes or gives, the pixel formats of its frames, the sample format,
 * rate and channels of its audio. A kind from ABI 1.0 has none: host memory,
 * any format. For each output port this picks one format that the producer
 * can give and every consumer takes: the lowest-numbered
 * spn_pixel_format_t (rgb24, bgr24, gray8, rgbf32p, bgrf32p, nv12, yuv420p)
 * both ends allow, so the choice never depends on the order of the config.
 * An edge whose ends share none is refused with the position of the input
 * reference and both stages named — unless convert = "auto" is set on the
 * edge or the consuming stage, where a stage of kind "convert" is inserted
 * between them (configured with the consumer's first accepted format).
 *
 * Memory kinds are never refused: where the two ends disagree the runtime
 * copies at run time (actor.c) and counts it per edge; here they are only
 * recorded on the edge (mem_from/mem_to) for the runtime and the summary.
 */
#include <stdlib.h>
#include <string.h>

#include "spec-build-internal.h"

#define KIND_HAS(k, field) \
  ((k)->struct_size >= offsetof(spn_stage_kind_t, field) + sizeof(((spn_stage_kind_t *)0)->field))

static const char *const pix_names[] = {NULL, "rgb24", "bgr24", "gray8", "rgbf32p", "bgrf32p", "nv12", "yuv420p"};
static const char *const sample_names[] = {NULL, "f32", "s16", "f32p"};
#define N_PIX ((int32_t)(sizeof pix_names / sizeof pix_names[0]))
#define N_SAMPLE ((int32_t)(sizeof sample_names / sizeof sample_names[0]))

const char *spn__pixel_format_name(int32_t f) { return f > 0 && f < N_PIX ? pix_names[f] : "any"; }

static void set_name(uint32_t set, const char *const *names, int32_t n, char *buf, size_t size) {
  size_t w = 0;
  buf[0] = '\0';
  for (int32_t f = 1; f < n; f++)
    if (set & SPN_FMTSET(f))
      spn__name_list_add(buf, size, &w, names[f]);
  if (!w)
    snprintf(buf, size, "%s", set ? "(none known)" : "any");
}

void spn__pixel_set_name(uint32_t set, char *buf, size_t size) { set_name(set, pix_names, N_PIX, buf, size); }

/* The lowest format in a set (the documented preference), 0 for none. */
static int32_t lowest(uint32_t set) {
  for (int32_t f = 1; f < 32; f++)
    if (set & SPN_FMTSET(f))
      return f;
  return 0;
}

int32_t spn__port_caps(const spn_stage_kind_t *k, const void *config, bool is_output, uint32_t port,
                       spn_port_caps_t *out, spn_error_t *err) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  const spn_port_caps_t *table = NULL;
  if (KIND_HAS(k, output_caps))
    table = is_output ? k->output_caps : k->input_caps;
  if (table) {
    const spn_port_caps_t *c = &table[port];
    /* A table entry from a newer header is read up to what this host knows. */
    size_t n = c->struct_size && c->struct_size < sizeof *out ? c->struct_size : sizeof *out;
    memcpy(out, c, n);
    out->struct_size = sizeof *out;
  }
  if (KIND_HAS(k, port_caps) && k->port_caps) {
    int32_t rc = k->port_caps(config, is_output, port, out, err);
    if (rc != SPN_OK)
      return rc;
  }
  if (!out->mem_kinds)
    out->mem_kinds = SPN_MEMSET_HOST;
  return SPN_OK;
}

int32_t spn__mem_plan(uint32_t accept, int32_t have, bool same_device, bool consumer_on_device) {
  if (!accept)
    accept = SPN_MEMSET_HOST;
  if (have == SPN_MEM_HOST && (accept & SPN_MEMSET_HOST))
    return -1;
  if (have == SPN_MEM_PINNED && (accept & (SPN_MEMSET_HOST | SPN_MEMSET_PINNED)))
    return -1;
  if (have == SPN_MEM_DEVICE && (accept & SPN_MEMSET_DEVICE) && same_device)
    return -1;
  if ((accept & SPN_MEMSET_DEVICE) && consumer_on_device)
    return SPN_MEM_DEVICE;
  if (accept & SPN_MEMSET_HOST)
    return SPN_MEM_HOST;
  if (accept & SPN_MEMSET_PINNED)
    return SPN_MEM_PINNED;
  return SPN_MEM_DEVICE;
}

/* The kind a consumer receives when it takes what the producer gives:
 * device memory if both allow it, then pinned, then pageable host. */
int32_t spn__mem_pick(uint32_t from, uint32_t to) {
  if (to & SPN_MEMSET_HOST)
    to |= SPN_MEMSET_PINNED;
  uint32_t both = from & to;
  uint32_t set = both ? both : to;
  if (set & SPN_MEMSET_DEVICE)
    return SPN_MEM_DEVICE;
  if (set & SPN_MEMSET_HOST)
    return SPN_MEM_HOST;
  return SPN_MEM_PINNED;
}

static int32_t fill_caps(spn__stage_spec_t *s, spn_error_t *err) {
  const spn_stage_kind_t *k = s->kind;
  free(s->in_caps);
  free(s->out_caps);
  s->in_caps = calloc(k->n_inputs ? k->n_inputs : 1, sizeof *s->in_caps);
  s->out_caps = calloc(k->n_outputs ? k->n_outputs : 1, sizeof *s->out_caps);
  if (!s->in_caps || !s->out_caps)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  int32_t rc;
  spn_error_t e = SPN_ERROR_INIT;
  for (uint32_t p = 0; p < k->n_inputs; p++)
    if ((rc = spn__port_caps(k, s->config, false, p, &s->in_caps[p], &e)) != SPN_OK)
      return spn_error_set(err, rc, "%s: stage \"%s\": input port \"%s\": %.700s", s->where, s->name,
                           k->inputs[p].name, e.msg);
  for (uint32_t p = 0; p < k->n_outputs; p++)
    if ((rc = spn__port_caps(k, s->config, true, p, &s->out_caps[p], &e)) != SPN_OK)
      return spn_error_set(err, rc, "%s: stage \"%s\": output port \"%s\": %.700s", s->where, s->name,
                           k->outputs[p].name, e.msg);
  return SPN_OK;
}

static int32_t refuse_pixels(const spn__pipeline_spec_t *spec, const spn__edge_spec_t *e, uint32_t gives,
                             bool convert_missing, spn_error_t *err) {
  const spn__stage_spec_t *from = &spec->stages[e->from_stage], *to = &spec->stages[e->to_stage];
  char g[128], t[128];
  spn__pixel_set_name(gives, g, sizeof g);
  spn__pixel_set_name(to->in_caps[e->to_port].pixel_formats, t, sizeof t);
  return spn_error_set(err, SPN_ECONFIG,
                       "%s: stage \"%s\": input port \"%s\" takes %s frames, but stage \"%s\" (\"%s.%s\") gives %s: "
                       "no common pixel format (%s)",
                       e->where, to->name, to->kind->inputs[e->to_port].name, t, from->name, from->name,
                       from->kind->outputs[e->from_port].name, g,
                       convert_missing ? "convert = \"auto\" is set but no stage kind \"convert\" is loaded"
                                       : "set convert = \"auto\" on the edge or the stage to insert a conversion");
}

static int32_t check_audio(const spn__pipeline_spec_t *spec, const spn__edge_spec_t *e, spn_port_format_t *f,
                           spn_error_t *err) {
  const spn__stage_spec_t *from = &spec->stages[e->from_stage], *to = &spec->stages[e->to_stage];
  const spn_port_caps_t *p = &from->out_caps[e->from_port], *c = &to->in_caps[e->to_port];
  const char *what = NULL;
  char g[64], t[64];
  if (p->sample_formats && c->sample_formats && !(p->sample_formats & c->sample_formats)) {
    set_name(p->sample_formats, sample_names, N_SAMPLE, g, sizeof g);
    set_name(c->sample_formats, sample_names, N_SAMPLE, t, sizeof t);
    what = "sample format";
  } else if (p->sample_rate && c->sample_rate && p->sample_rate != c->sample_rate) {
    snprintf(g, sizeof g, "%u Hz", p->sample_rate);
    snprintf(t, sizeof t, "%u Hz", c->sample_rate);
    what = "sample rate";
  } else if (p->channels && c->channels && p->channels != c->channels) {
    snprintf(g, sizeof g, "%u channels", p->channels);
    snprintf(t, sizeof t, "%u channels", c->channels);
    what = "channel count";
  }
  if (what)
    return spn_error_set(err, SPN_ECONFIG,
                         "%s: stage \"%s\": input port \"%s\" takes %s audio, but stage \"%s\" (\"%s.%s\") gives %s "
                         "(%s mismatch; audio is never converted implicitly)",
                         e->where, to->name, to->kind->inputs[e->to_port].name, t, from->name, from->name,
                         from->kind->outputs[e->from_port].name, g, what);
  uint32_t sf = p->sample_formats && c->sample_formats ? p->sample_formats & c->sample_formats
                                                      : (p->sample_formats | c->sample_formats);
  f->sample_format = lowest(sf);
  f->sample_rate = p->sample_rate ? p->sample_rate : c->sample_rate;
  f->channels = p->channels ? p->channels : c->channels;
  return SPN_OK;
}

/* Insert a "convert" stage in front of edge e's consumer, configured to give
 * `target`; e then feeds the converter and a new edge leaves it. */
static int32_t insert_convert(spn__pipeline_spec_t *spec, size_t ei, const spn_stage_kind_t *ck, int32_t target,
                              spn_error_t *err) {
  spn__edge_spec_t e = spec->edges[ei];
  uint32_t at = e.to_stage; /* producers stay before, the consumer after */
  spn__stage_spec_t *v = realloc(spec->stages, (spec->n_stages + 1) * sizeof *v);
  if (!v)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  spec->stages = v;
  spn__edge_spec_t *ev = realloc(spec->edges, (spec->n_edges + 1) * sizeof *ev);
  if (!ev)
    return spn_error_set(err, SPN_ENOMEM, "out of memory");
  spec->edges = ev;
  spn__stage_spec_t c = {.kind = ck, .instances = 1, .max_batch = ck->max_batch ? ck->max_batch : 1,
                         .max_delay_ms = ck->max_delay_ms, .inserted = true};
  snprintf(c.where, sizeof c.where, "%s", e.where);
  size_t nl = strlen(spec->stages[at].name) + strlen(spec->stages[at].kind->inputs[e.to_port].name) + 16;
  int32_t rc = SPN_OK;
  c.name = malloc(nl);
  c.device = strdup("auto");
  if (!c.name || !c.device) {
    rc = spn_error_set(err, SPN_ENOMEM, "out of memory");
    goto fail;
  }
  /* '@' cannot appear in a configured name, so this never collides. */
  snprintf(c.name, nl, "convert@%s.%s", spec->stages[at].name, spec->stages[at].kind->inputs[e.to_port].name);
  const spn_config_field_t *f = spn__config_field(ck, "pixel_format");
  if (!f || f->type != SPN_CONFIG_STRING) {
    rc = spn_error_set(err, SPN_ECONFIG, "%s: stage kind \"convert\" has no string key \"pixel_format\"", e.where);
    goto fail;
  }
  if ((rc = spn__config_new(ck, &c.config, err)) != SPN_OK)
    goto fail;
  char text[64];
  snprintf(text, sizeof text, "\"%s\"", spn__pixel_format_name(target));
  spn_toml_doc_t *doc = NULL;
  const spn_toml_node_t *node = NULL;
  if ((rc = spn__override_value(text, &doc, &node, err)) != SPN_OK)
    goto fail;
  rc = spn__config_set(ck, f, c.config, node, e.where, c.name, NULL, err);
  spn_toml_doc_free(&doc);
  if (rc != SPN_OK || (rc = fill_caps(&c, err)) != SPN_OK)
    goto fail;
  memmove(&spec->stages[at + 1], &spec->stages[at], (spec->n_stages - at) * sizeof *spec->stages);
  spec->stages[at] = c;
  spec->n_stages++;
  for (size_t i = 0; i < spec->n_edges; i++) {
    if (spec->edges[i].from_stage >= at)
      spec->edges[i].from_stage++;
    if (spec->edges[i].to_stage >= at)
      spec->edges[i].to_stage++;
  }
  /* e now feeds the converter's port 0; the new edge leaves its port 0. */
  spn__edge_spec_t out = spec->edges[ei];
  spec->edges[ei].to_stage = at;
  spec->edges[ei].to_port = 0;
  spec->edges[ei].convert = false;
  out.from_stage = at;
  out.from_port = 0;
  out.convert = false;
  spec->edges[spec->n_edges++] = out;
  return SPN_OK;
fail:
  if (c.config)
    spn__config_free(ck, &c.config);
  free(c.in_caps);
  free(c.out_caps);
  free(c.name);
  free(c.device);
  return rc;
}

static bool edge_video(const spn__pipeline_spec_t *spec, const spn__edge_spec_t *e) {
  return spec->stages[e->from_stage].out_caps[e->from_port].pixel_formats &&
         spec->stages[e->to_stage].in_caps[e->to_port].pixel_formats;
}

/* One output port: pick F, refuse or convert the edges that cannot take it. */
static int32_t negotiate_port(const spn__registry_t *reg, spn__pipeline_spec_t *spec, uint32_t si, uint32_t port,
                              spn_error_t *err) {
  uint32_t gives = spec->stages[si].out_caps[port].pixel_formats;
  uint32_t strict = gives, pref;
  int32_t rc;
  /* Edges without a conversion must all take F. */
  for (size_t i = 0; i < spec->n_edges; i++) {
    const spn__edge_spec_t *e = &spec->edges[i];
    if (e->from_stage != si || e->from_port != port || !edge_video(spec, e) || e->convert)
      continue;
    uint32_t takes = spec->stages[e->to_stage].in_caps[e->to_port].pixel_formats;
    if (!(strict & takes))
      return refuse_pixels(spec, e, strict, false, err);
    strict &= takes;
  }
  /* Among what is left, one the convertible edges take too where possible. */
  pref = strict;
  for (size_t i = 0; i < spec->n_edges; i++) {
    const spn__edge_spec_t *e = &spec->edges[i];
    if (e->from_stage != si || e->from_port != port || !edge_video(spec, e) || !e->convert)
      continue;
    uint32_t takes = spec->stages[e->to_stage].in_caps[e->to_port].pixel_formats;
    if (pref & takes)
      pref &= takes;
  }
  int32_t chosen = lowest(pref);
  size_t n_edges = spec->n_edges; /* conversions append edges: visit the original ones */
  for (size_t i = 0; i < n_edges; i++) {
    spn__edge_spec_t *e = &spec->edges[i];
    if (e->from_stage != si || e->from_port != port)
      continue;
    const spn_port_caps_t *oc = &spec->stages[e->from_stage].out_caps[e->from_port];
    const spn_port_caps_t *ic = &spec->stages[e->to_stage].in_caps[e->to_port];
    e->format.struct_size = sizeof e->format;
    e->mem_from = oc->mem_kinds;
    e->mem_to = ic->mem_kinds;
    e->format.mem_kind = spn__mem_pick(oc->mem_kinds, ic->mem_kinds);
    if ((rc = check_audio(spec, e, &e->format, err)) != SPN_OK)
      return rc;
    if (!gives) {
      /* A producer that declares nothing: the consumer's own check at run
       * time is all there is (ABI 1.0 behaviour). */
      e->format.pixel_format = ic->pixel_formats && !(ic->pixel_formats & (ic->pixel_formats - 1))
                                   ? lowest(ic->pixel_formats) : 0;
      continue;
    }
    e->format.pixel_format = chosen;
    if (!ic->pixel_formats || (ic->pixel_formats & SPN_FMTSET(chosen)))
      continue;
    const spn_stage_kind_t *ck = spn__registry_find(reg, "convert", NULL);
    if (!ck)
      return refuse_pixels(spec, e, gives, true, err);
    uint32_t to_stage = e->to_stage, to_port = e->to_port;
    if ((rc = insert_convert(spec, i, ck, lowest(ic->pixel_formats), err)) != SPN_OK)
      return rc;
    /* The converter sits at index to_stage now; its own edges get formats. */
    spn__stage_spec_t *cs = &spec->stages[to_stage];
    if (!(cs->in_caps[0].pixel_formats & SPN_FMTSET(chosen)) && cs->in_caps[0].pixel_formats) {
      spn__edge_spec_t tmp = spec->edges[i];
      return refuse_pixels(spec, &tmp, gives, false, err);
    }
    spn__edge_spec_t *ce = &spec->edges[spec->n_edges - 1];
    ce->format = spec->edges[i].format;
    ce->format.pixel_format = lowest(spec->stages[to_stage + 1].in_caps[to_port].pixel_formats);
    ce->mem_from = cs->out_caps[0].mem_kinds;
    ce->mem_to = spec->stages[to_stage + 1].in_caps[to_port].mem_kinds;
    ce->format.mem_kind = spn__mem_pick(ce->mem_from, ce->mem_to);
    spec->edges[i].mem_to = cs->in_caps[0].mem_kinds;
    spec->edges[i].format.mem_kind = spn__mem_pick(spec->edges[i].mem_from, spec->edges[i].mem_to);
  }
  return SPN_OK;
}

int32_t spn__spec_negotiate(const spn__registry_t *reg, spn__pipeline_spec_t *spec, spn_error_t *err) {
  int32_t rc;
  for (size_t i = 0; i < spec->n_stages; i++)
    if ((rc = fill_caps(&spec->stages[i], err)) != SPN_OK)
      return rc;
  /* Producers in topological order; a conversion is inserted right before
   * its consumer, so indexes below the current stage never move. */
  for (uint32_t si = 0; si < spec->n_stages; si++) {
    if (spec->stages[si].inserted)
      continue;
    for (uint32_t p = 0; p < spec->stages[si].kind->n_outputs; p++)
      if ((rc = negotiate_port(reg, spec, si, p, err)) != SPN_OK)
        return rc;
  }
  /* Edges leaving a converter were filled when it was inserted. */
  return SPN_OK;
}
