/* cli-plugins.c — `spindle plugins`: every stage kind the search path
 * provides, with its plugin file, ports, device needs, batching and config
 * schema (types, defaults, ranges, docs). What a pipeline author needs to
 * write a [[stage]] table without reading the plugin's source. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *type_name(int32_t t) {
  switch (t) {
  case SPN_CONFIG_STRING: return "string";
  case SPN_CONFIG_INT: return "int";
  case SPN_CONFIG_FLOAT: return "float";
  case SPN_CONFIG_BOOL: return "bool";
  case SPN_CONFIG_PATH: return "path";
  default: return "?";
  }
}

static const char *need_name(int32_t n) {
  switch (n) {
  case SPN_NEED_CPU: return "cpu";
  case SPN_NEED_CUDA: return "cuda";
  default: return "cpu or cuda";
  }
}

static void print_ports(const char *what, const spn_port_t *p, uint32_t n) {
  printf("  %-8s", what);
  if (!n)
    printf(" (none)");
  for (uint32_t i = 0; i < n; i++)
    printf("%s %s (%s)", i ? "," : "", p[i].name, p[i].type);
  printf("\n");
}

static void print_default(const spn_config_field_t *f) {
  char buf[64];
  if (f->flags & SPN_CONFIG_REQUIRED) {
    printf("%-14s", "required");
    return;
  }
  switch (f->type) {
  case SPN_CONFIG_STRING:
  case SPN_CONFIG_PATH:
    if (f->def_str)
      snprintf(buf, sizeof buf, "\"%s\"", f->def_str);
    else
      snprintf(buf, sizeof buf, "(unset)");
    break;
  case SPN_CONFIG_INT: snprintf(buf, sizeof buf, "%lld", (long long)f->def_int); break;
  case SPN_CONFIG_FLOAT: snprintf(buf, sizeof buf, "%g", f->def_float); break;
  case SPN_CONFIG_BOOL: snprintf(buf, sizeof buf, "%s", f->def_int ? "true" : "false"); break;
  default: buf[0] = '\0';
  }
  printf("%-14s", buf);
}

static void print_kind(const spn_stage_kind_t *k, const char *file) {
  printf("%s\n", k->name);
  if (k->doc)
    printf("  %s\n", k->doc);
  printf("  %-8s %s\n", "plugin", file ? file : "(built-in)");
  print_ports("inputs", k->inputs, k->n_inputs);
  print_ports("outputs", k->outputs, k->n_outputs);
  printf("  %-8s %s; batching max_batch = %u, max_delay_ms = %u\n", "device", need_name(k->device_need),
         k->max_batch, k->max_delay_ms);
  if (!k->schema || !k->schema[0].key) {
    printf("  config   (no keys)\n\n");
    return;
  }
  printf("  config:\n");
  for (const spn_config_field_t *f = k->schema; f->key; f++) {
    printf("    %-16s %-7s ", f->key, type_name(f->type));
    print_default(f);
    if (f->min < f->max)
      printf(" [%.15g, %.15g]", f->min, f->max);
    if (f->flags & SPN_CONFIG_PER_JOB)
      printf(" per-job");
    printf("  %s\n", f->doc ? f->doc : "");
  }
  printf("\n");
}

static void usage(FILE *f) {
  fprintf(f, "usage: spindle plugins [--plugin-path DIR]... [KIND]\n"
             "Lists the stage kinds of every plugin on the search path (--plugin-path,\n"
             "$SPINDLE_PLUGIN_PATH, the install directory), or one KIND.\n");
}

int spn_cli_plugins(int argc, char **argv) {
  static const char *const allowed[] = {"plugin-path", NULL};
  spn_cli_opts_t o;
  int rc = spn_cli_parse_cmd(argc, argv, allowed, false, usage, &o);
  if (rc >= 0)
    return rc;
  spn_runtime_t *rt = NULL;
  rc = spn_cli_runtime(&o, true, &rt);
  if (rc) {
    spn_cli_opts_free(&o);
    return rc;
  }
  size_t n = spn_runtime_kind_count(rt), shown = 0;
  for (size_t i = 0; i < n; i++) {
    const char *file = NULL;
    const spn_stage_kind_t *k = spn_runtime_kind_at(rt, i, &file);
    if (o.file && strcmp(o.file, k->name))
      continue;
    print_kind(k, file);
    shown++;
  }
  if (o.file && !shown) {
    fprintf(stderr, "spindle plugins: no stage kind \"%s\" on the search path\n", o.file);
    rc = 1;
  } else if (!n) {
    fprintf(stderr, "spindle plugins: no plugins found (try --plugin-path DIR or SPINDLE_PLUGIN_PATH)\n");
    rc = 1;
  }
  spn_runtime_free(&rt);
  spn_cli_opts_free(&o);
  return rc;
}
