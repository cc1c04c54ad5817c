/* cli-validate.c — `spindle validate PIPELINE.toml`: everything spindle run
 * checks before it starts (TOML syntax, kinds, keys, values, wiring), and
 * nothing it does after (no stage is created, no model loaded). Exit 0 when
 * the pipeline is valid, 2 with "file:line:col: stage ...: reason" when not. */
#include <stdio.h>

#include "cli.h"

static void usage(FILE *f) {
  fprintf(f, "usage: spindle validate PIPELINE.toml [--set stage.key=value]... [--plugin-path DIR]...\n"
             "Checks a pipeline config without running it; exit 0 when valid, 2 when not.\n");
}

int spn_cli_validate(int argc, char **argv) {
  static const char *const allowed[] = {"plugin-path", "set", NULL};
  spn_cli_opts_t o;
  int rc = spn_cli_parse_cmd(argc, argv, allowed, true, usage, &o);
  if (rc >= 0)
    return rc;
  spn_runtime_t *rt = NULL;
  rc = spn_cli_runtime(&o, true, &rt);
  if (rc) {
    spn_cli_opts_free(&o);
    return rc;
  }
  spn_error_t err = SPN_ERROR_INIT;
  if (spn_pipeline_validate(rt, o.file, o.sets, o.n_sets, &err) != SPN_OK) {
    fprintf(stderr, "spindle validate: %s\n", err.msg);
    rc = 2;
  } else {
    printf("%s: ok\n", o.file);
  }
  spn_runtime_free(&rt);
  spn_cli_opts_free(&o);
  return rc;
}
