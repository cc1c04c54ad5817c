/* cli.h — the `spindle` command line: one entry per subcommand.
 * Each subcommand lives in its own cli-<name>.c and returns the process exit
 * code (0 success, 1 the work failed, 2 usage error). */
#ifndef SPINDLE_CLI_H
#define SPINDLE_CLI_H

typedef struct spn_cli_cmd {
  const char *name;
  const char *summary;
  int (*main)(int argc, char **argv); /* argv[0] is the subcommand name */
} spn_cli_cmd_t;

int spn_cli_version(int argc, char **argv);
int spn_cli_serve(int argc, char **argv);
int spn_cli_worker(int argc, char **argv);
int spn_cli_submit(int argc, char **argv);
int spn_cli_status(int argc, char **argv);
int spn_cli_watch(int argc, char **argv);
int spn_cli_cancel(int argc, char **argv);
int spn_cli_jobs(int argc, char **argv);
int spn_cli_workers(int argc, char **argv);
int spn_cli_keygen(int argc, char **argv);
int spn_cli_run(int argc, char **argv);
int spn_cli_validate(int argc, char **argv);
int spn_cli_plugins(int argc, char **argv);
int spn_cli_model(int argc, char **argv);
/* `spindle model list|fetch|verify|path|convert-ncnn` (cli-model-fetch.c); argv[0] is the verb. */
int spn__cli_model_names(int argc, char **argv);

/* ---- shared by the subcommands (cli-common.c) ---- */

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include "spindle/runtime.h"

/* Option parsing: every subcommand reads its argv with getopt_long through
 * spn_cli_next, so `--name value`, `--name=value`, unambiguous prefixes and
 * `--` behave the same everywhere, and mistakes get one message shape:
 *   spindle CMD: unknown option '--x' (see 'spindle CMD --help')
 *   spindle CMD: option '--x' needs a value
 * Each table ends with SPN_CLI_HELP_OPT and a zero entry. getopt's state is
 * process-wide: parse one argv at a time, on the main thread. */
#define SPN_CLI_HELP_OPT {"help", no_argument, NULL, 'h'}
enum {
  SPN_CLI_END = -1, /* no more arguments */
  SPN_CLI_BAD = -2, /* a usage error, already printed: exit 2 */
  SPN_CLI_ARG = 1,  /* a positional argument, in g->arg (in command-line order) */
};
typedef struct spn_cli_getopt {
  const char *cmd;  /* for messages, e.g. "serve" or "model run" */
  const char *arg;  /* the option's value or the positional argument */
  const char *name; /* the option as written (for messages about its value) */
  bool started;
  int rest; /* after "--": the next argv index to hand out as a positional */
} spn_cli_getopt_t;
/* The next option's val (or 'h', SPN_CLI_ARG, SPN_CLI_END, SPN_CLI_BAD).
 * argv[0] is the subcommand; parsing starts at argv[1]. */
int spn_cli_next(spn_cli_getopt_t *g, int argc, char **argv, const struct option *opts);

/* A number of seconds for option --opt of `spindle cmd` in [lo, hi] (lo
 * itself only when lo_ok): 0 with *out set, or 2 (a usage error) after
 * "spindle CMD: --OPT 'VAL': expected seconds in (LO, HI]" on stderr. The
 * one parser of every option that takes seconds. */
/* --log-level VAL: debug, info, warn or error into *level (spn_log_level_t);
 * anything else is said on stderr ("spindle CMD: --log-level ...") and
 * returns 2 (usage), else 0. */
int spn_cli_log_level(const char *cmd, const char *val, int32_t *level);
int spn_cli_seconds(const char *cmd, const char *opt, const char *val, double lo, bool lo_ok, double hi,
                    double *out);

/* Options every pipeline command takes. Strings point into argv. */
typedef struct spn_cli_opts {
  const char **plugin_paths; /* --plugin-path, then the build tree's stages/ when run uninstalled */
  size_t n_plugin_paths;
  const char **sets;         /* --set stage.key=value */
  size_t n_sets;
  const char **inputs;       /* --input NAME=PATH (spindle run): by the config's [pipeline.inputs] */
  size_t n_inputs;
  const char **outputs;      /* --output NAME=PATH */
  size_t n_outputs;
  const char **params;       /* --param NAME=VALUE */
  size_t n_params;
  const char *devices;       /* --devices */
  int32_t log_format;        /* --log-format */
  int32_t log_level;         /* --log-level (spn_log_level_t), SPN_LOG_INFO when not given */
  int32_t repeat;            /* --repeat (spindle run), 1 when not given */
  double timeout_s;          /* --timeout (spindle run): seconds a run may take; 0 none */
  double cancel_grace_s;     /* --cancel-grace (spindle run): after a cancel, seconds before quitting
                                without the stages; 0 waits for ever; 120 when not given */
  const char *file;          /* the one positional argument, or NULL */
  char **owned;              /* strings this struct allocated */
  size_t n_owned;
} spn_cli_opts_t;

/* Parse argv (argv[0] is the subcommand). `allowed` lists the long options
 * the command accepts ("plugin-path", "set", "devices", "log-format",
 * "repeat", "timeout", "cancel-grace", "input", "output", "param").
 * Returns 0, -1 for --help, or 2 after printing a usage error. */
int spn_cli_parse(int argc, char **argv, const char *const *allowed, spn_cli_opts_t *o);
void spn_cli_opts_free(spn_cli_opts_t *o);
/* spn_cli_parse, then what each pipeline command does with the outcome:
 * --help prints usage on stdout (exit 0); a usage error, or no file where
 * the command needs one (need_file), prints it on stderr (exit 2). Returns
 * -1 to go on with *o filled, else the exit status (*o freed). */
int spn_cli_parse_cmd(int argc, char **argv, const char *const *allowed, bool need_file, void (*usage)(FILE *),
                      spn_cli_opts_t *o);
/* A runtime with the command's plugin paths, plugins loaded. Refused
 * plugins are reported on stderr as warnings. Returns 0 or an exit code. */
int spn_cli_runtime(const spn_cli_opts_t *o, bool load_plugins, spn_runtime_t **out);

#endif
