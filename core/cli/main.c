/* main.c — `spindle` entry point: dispatches to a subcommand.
 * Subcommands are listed in one table so `spindle help` always shows every
 * one of them; each is implemented in its own file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int spn_cli_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("spindle %s\n", SPN_VERSION);
  return 0;
}

static const spn_cli_cmd_t commands[] = {
    {"version", "print the version", spn_cli_version},
    {"run", "run one job through a pipeline", spn_cli_run},
    {"validate", "check a pipeline config without running it", spn_cli_validate},
    {"plugins", "list stage kinds, their ports and config keys", spn_cli_plugins},
    {"serve", "run the job gateway and in-process workers", spn_cli_serve},
    {"worker", "run jobs leased from a remote gateway", spn_cli_worker},
    {"submit", "submit a job (--wait to follow it)", spn_cli_submit},
    {"status", "show a job", spn_cli_status},
    {"watch", "follow a job's progress until it ends", spn_cli_watch},
    {"cancel", "cancel a job", spn_cli_cancel},
    {"jobs", "list jobs", spn_cli_jobs},
    {"workers", "list the workers, and which pipelines have one", spn_cli_workers},
    {"keygen", "create a CURVE key pair", spn_cli_keygen},
    {"model", "inspect or run an ONNX model", spn_cli_model},
};

static void usage(FILE *f) {
  fprintf(f, "usage: spindle <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'spindle <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version"))
    return spn_cli_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name))
      return commands[i].main(argc - 1, argv + 1);
  fprintf(stderr, "spindle: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
