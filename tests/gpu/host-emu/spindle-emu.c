/* spindle-emu.c — `spindle model ...` (core/cli/cli-model.c) linked with the
 * fake CUDA runtime, cuDNN and cuBLASLt (tests/gpu/host-emu/README), so
 * tests/engine/conformance.py runs its cases on the CUDA engine backend
 * ("--device cuda:0") without a GPU. Test program; not installed. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "model"))
    return spn_cli_model(argc - 1, argv + 1);
  fprintf(stderr, "usage: spindle-emu model inspect|run ... (as `spindle model`, CUDA emulated on the host)\n");
  return 2;
}
