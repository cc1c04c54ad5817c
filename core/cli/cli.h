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
int spn_cli_model(int argc, char **argv);

#endif
