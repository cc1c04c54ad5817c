/* cli-common.c — option parsing and runtime set-up shared by `spindle run`,
 * `validate` and `plugins`.
 *
 * One rule the commands share: when the `spindle` binary runs from a meson
 * build tree (uninstalled), the tree's built stages are searched after the
 * --plugin-path folders, so `build/core/cli/spindle run configs/x.toml`
 * works without installing or setting SPINDLE_PLUGIN_PATH. An installed
 * binary never looks there.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static int push(const char ***v, size_t *n, const char *s) {
  const char **nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!nv)
    return -1;
  nv[(*n)++] = s;
  *v = nv;
  return 0;
}

static int own(spn_cli_opts_t *o, char *s) {
  char **nv = realloc(o->owned, (o->n_owned + 1) * sizeof *nv);
  if (!nv) {
    free(s);
    return -1;
  }
  nv[o->n_owned++] = s;
  o->owned = nv;
  return 0;
}

/* <build>/stages/<group> folders when this binary is <build>/core/cli/spindle
 * of a meson build tree (recognised by <build>/meson-private). */
static void add_build_tree_stages(spn_cli_opts_t *o) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash)
    return;
  *slash = '\0';
  static const char tail[] = "/core/cli";
  size_t len = strlen(exe), tl = sizeof tail - 1;
  if (len < tl || strcmp(exe + len - tl, tail))
    return;
  exe[len - tl] = '\0';
  char probe[PATH_MAX + 32];
  struct stat st;
  snprintf(probe, sizeof probe, "%s/meson-private", exe);
  if (stat(probe, &st) != 0)
    return;
  snprintf(probe, sizeof probe, "%s/stages", exe);
  DIR *d = opendir(probe);
  if (!d)
    return;
  struct dirent *de;
  char *found[32];
  size_t nf = 0;
  while ((de = readdir(d)) && nf < 32) {
    if (de->d_name[0] == '.')
      continue;
    size_t sz = strlen(probe) + strlen(de->d_name) + 2;
    char *p = malloc(sz);
    if (!p)
      break;
    snprintf(p, sz, "%s/%s", probe, de->d_name);
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
      found[nf++] = p;
    else
      free(p);
  }
  closedir(d);
  for (size_t i = 0; i < nf; i++) {
    for (size_t j = i + 1; j < nf; j++)
      if (strcmp(found[j], found[i]) < 0) {
        char *t = found[i];
        found[i] = found[j];
        found[j] = t;
      }
    if (own(o, found[i]) == 0)
      push(&o->plugin_paths, &o->n_plugin_paths, found[i]);
  }
}

int spn_cli_next(spn_cli_getopt_t *g, int argc, char **argv, const struct option *opts) {
  if (!g->started) {
    optind = 0; /* glibc: start over, whatever an earlier parse left */
    g->started = true;
  }
  if (g->rest) { /* everything after "--" is positional */
    if (g->rest >= argc)
      return SPN_CLI_END;
    g->arg = g->name = argv[g->rest++];
    return SPN_CLI_ARG;
  }
  opterr = 0;
  /* "-": positional arguments come back in order (SPN_CLI_ARG), whatever
   * POSIXLY_CORRECT says; ":": a missing value is told apart. */
  int idx = -1;
  int c = getopt_long(argc, argv, "-:h", opts, &idx);
  if (c == -1) {
    if (optind >= argc)
      return SPN_CLI_END;
    g->rest = optind; /* stopped at "--" */
    return spn_cli_next(g, argc, argv, opts);
  }
  g->arg = optarg;
  const char *as_written = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
  g->name = idx >= 0 ? opts[idx].name : as_written;
  if (c == '?' || c == ':') {
    char shown[64];
    if (optopt && strncmp(as_written, "--", 2) != 0)
      snprintf(shown, sizeof shown, "-%c", optopt);
    else
      snprintf(shown, sizeof shown, "%.*s", (int)strcspn(as_written, "="), as_written);
    if (c == '?')
      fprintf(stderr, "spindle %s: unknown option '%s' (see 'spindle %s --help')\n", g->cmd, shown, g->cmd);
    else
      fprintf(stderr, "spindle %s: option '%s' needs a value\n", g->cmd, shown);
    return SPN_CLI_BAD;
  }
  return c;
}

enum {
  O_PLUGIN_PATH = 256,
  O_SET,
  O_DEVICES,
  O_LOG_FORMAT,
  O_LOG_LEVEL,
  O_REPEAT,
  O_TIMEOUT,
  O_CANCEL_GRACE,
  O_INPUT,
  O_OUTPUT,
  O_PARAM
};

/* --input/--output/--param NAME=VALUE: the name given once. */
static int push_named(const char *cmd, const char *opt, const char ***v, size_t *n, const char *val) {
  const char *eq = strchr(val, '=');
  if (!eq || eq == val || (strcmp(opt, "param") && !eq[1])) {
    fprintf(stderr, "spindle %s: --%s '%s': expected NAME=%s\n", cmd, opt, val, strcmp(opt, "param") ? "PATH" : "VALUE");
    return 2;
  }
  for (size_t i = 0; i < *n; i++)
    if (!strncmp((*v)[i], val, (size_t)(eq - val) + 1)) {
      fprintf(stderr, "spindle %s: --%s %.*s is given twice\n", cmd, opt, (int)(eq - val), val);
      return 2;
    }
  return push(v, n, val);
}

int spn_cli_log_level(const char *cmd, const char *val, int32_t *level) {
  static const char *const names[] = {"debug", "info", "warn", "error"};
  for (int32_t i = 0; i < 4; i++)
    if (!strcmp(val, names[i])) {
      *level = i; /* spn_log_level_t: SPN_LOG_DEBUG 0 .. SPN_LOG_ERROR 3 */
      return 0;
    }
  fprintf(stderr, "spindle %s: --log-level '%s': expected debug, info, warn or error\n", cmd, val);
  return 2;
}

int spn_cli_seconds(const char *cmd, const char *opt, const char *val, double lo, bool lo_ok, double hi,
                    double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(val, &end);
  if (errno || end == val || *end || !(lo_ok ? v >= lo : v > lo) || !(v <= hi)) {
    fprintf(stderr, "spindle %s: --%s '%s': expected seconds in %s%.10g, %.10g]\n", cmd, opt, val, lo_ok ? "[" : "(", lo,
            hi);
    return 2;
  }
  *out = v;
  return 0;
}

int spn_cli_parse(int argc, char **argv, const char *const *allowed, spn_cli_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->repeat = 1;
  o->cancel_grace_s = 120;
  o->log_level = SPN_LOG_INFO;
  static const struct option all[] = {{"plugin-path", required_argument, NULL, O_PLUGIN_PATH},
                                      {"set", required_argument, NULL, O_SET},
                                      {"devices", required_argument, NULL, O_DEVICES},
                                      {"log-format", required_argument, NULL, O_LOG_FORMAT},
                                      {"log-level", required_argument, NULL, O_LOG_LEVEL},
                                      {"repeat", required_argument, NULL, O_REPEAT},
                                      {"timeout", required_argument, NULL, O_TIMEOUT},
                                      {"cancel-grace", required_argument, NULL, O_CANCEL_GRACE},
                                      {"input", required_argument, NULL, O_INPUT},
                                      {"output", required_argument, NULL, O_OUTPUT},
                                      {"param", required_argument, NULL, O_PARAM}};
  struct option opts[sizeof all / sizeof all[0] + 2];
  size_t n = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    for (size_t k = 0; allowed && allowed[k]; k++)
      if (!strcmp(allowed[k], all[i].name))
        opts[n++] = all[i];
  opts[n++] = (struct option)SPN_CLI_HELP_OPT;
  opts[n] = (struct option){0};
  const char *cmd = argv[0];
  spn_cli_getopt_t g = {.cmd = cmd};
  int c;
  while ((c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END) {
    const char *val = g.arg;
    switch (c) {
    case 'h':
      return -1;
    case SPN_CLI_BAD:
      return 2;
    case SPN_CLI_ARG:
      if (o->file) {
        fprintf(stderr, "spindle %s: one file only (got '%s' and '%s')\n", cmd, o->file, val);
        return 2;
      }
      o->file = val;
      break;
    case O_PLUGIN_PATH:
      if (push(&o->plugin_paths, &o->n_plugin_paths, val))
        return 2;
      break;
    case O_SET:
      if (!strchr(val, '=') || !strchr(val, '.')) {
        fprintf(stderr, "spindle %s: --set '%s': expected stage.key=value\n", cmd, val);
        return 2;
      }
      if (push(&o->sets, &o->n_sets, val))
        return 2;
      break;
    case O_INPUT:
      if (push_named(cmd, "input", &o->inputs, &o->n_inputs, val))
        return 2;
      break;
    case O_OUTPUT:
      if (push_named(cmd, "output", &o->outputs, &o->n_outputs, val))
        return 2;
      break;
    case O_PARAM:
      if (push_named(cmd, "param", &o->params, &o->n_params, val))
        return 2;
      break;
    case O_DEVICES:
      o->devices = val;
      break;
    case O_LOG_FORMAT:
      if (!strcmp(val, "json"))
        o->log_format = SPN_LOG_FORMAT_JSON;
      else if (!strcmp(val, "text"))
        o->log_format = SPN_LOG_FORMAT_TEXT;
      else {
        fprintf(stderr, "spindle %s: --log-format '%s': expected json or text\n", cmd, val);
        return 2;
      }
      break;
    case O_LOG_LEVEL:
      if (spn_cli_log_level(cmd, val, &o->log_level) != 0)
        return 2;
      break;
    case O_REPEAT: {
      char *end = NULL;
      errno = 0;
      long v = strtol(val, &end, 10);
      if (errno || end == val || *end || v < 1 || v > 1000) {
        fprintf(stderr, "spindle %s: --repeat '%s': expected a whole number from 1 to 1000\n", cmd, val);
        return 2;
      }
      o->repeat = (int32_t)v;
      break;
    }
    case O_TIMEOUT: /* the job service's range (a job's "timeout": 7 days) */
      if (spn_cli_seconds(cmd, "timeout", val, 0, false, 7 * 86400, &o->timeout_s))
        return 2;
      break;
    case O_CANCEL_GRACE: /* server.cancel_grace_s's range */
      if (spn_cli_seconds(cmd, "cancel-grace", val, 0, true, 86400, &o->cancel_grace_s))
        return 2;
      break;
    default:
      return 2;
    }
  }
  add_build_tree_stages(o);
  return 0;
}

int spn_cli_parse_cmd(int argc, char **argv, const char *const *allowed, bool need_file, void (*usage)(FILE *),
                      spn_cli_opts_t *o) {
  int rc = spn_cli_parse(argc, argv, allowed, o);
  if (!rc && (o->file || !need_file))
    return -1;
  usage(rc < 0 ? stdout : stderr);
  spn_cli_opts_free(o);
  return rc < 0 ? 0 : 2;
}

void spn_cli_opts_free(spn_cli_opts_t *o) {
  free(o->plugin_paths);
  free(o->sets);
  free(o->inputs);
  free(o->outputs);
  free(o->params);
  for (size_t i = 0; i < o->n_owned; i++)
    free(o->owned[i]);
  free(o->owned);
  memset(o, 0, sizeof *o);
}

int spn_cli_runtime(const spn_cli_opts_t *o, bool load_plugins, spn_runtime_t **out) {
  spn_runtime_opts_t ro = SPN_RUNTIME_OPTS_INIT;
  ro.devices = o->devices;
  ro.plugin_paths = o->plugin_paths;
  ro.n_plugin_paths = o->n_plugin_paths;
  ro.log_format = o->log_format;
  ro.log_level = o->log_level;
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_runtime_new(&ro, out, &err) != SPN_OK) {
    fprintf(stderr, "spindle: %s\n", err.msg);
    return o->devices ? 2 : 1;
  }
  if (load_plugins && spn_runtime_load_plugins(*out, &err) != SPN_OK)
    fprintf(stderr, "spindle: warning: %s\n", err.msg);
  return 0;
}
