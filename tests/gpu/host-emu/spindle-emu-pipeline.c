/* spindle-emu-pipeline.c — the `spindle` subcommands that run pipelines
 * (run, validate, plugins) and `model`, linked with libspindle's objects and
 * libspn-cuda-emu.so (the fake CUDA runtime, cuDNN and cuBLASLt and the
 * kernels built for the host: tests/gpu/host-emu/README), so the gpu suite's
 * pipeline tests run their configs with "--devices cuda" on a fake GPU,
 * with the emulated stage plugins of this folder. The job service's
 * commands are left out: they link libspindle.so itself. Test program; not
 * installed. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int spn_cli_version(int argc, char **argv) {
  (void)argc, (void)argv;
  printf("spindle %s (CUDA emulated on the host)\n", SPN_VERSION);
  return 0;
}

static const spn_cli_cmd_t commands[] = {
    {"version", "print the version", spn_cli_version},
    {"run", "run one job through a pipeline", spn_cli_run},
    {"validate", "check a pipeline config without running it", spn_cli_validate},
    {"plugins", "list stage kinds, their ports and config keys", spn_cli_plugins},
    {"model", "inspect or run an ONNX model", spn_cli_model},
};

int main(int argc, char **argv) {
  if (argc >= 2)
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
      if (!strcmp(argv[1], commands[i].name))
        return commands[i].main(argc - 1, argv + 1);
  fprintf(stderr, "usage: spindle-emu-pipeline <command> ... (as `spindle`, CUDA emulated on the host)\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(stderr, "  %-10s %s\n", commands[i].name, commands[i].summary);
  return 2;
}
