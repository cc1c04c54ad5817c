/* bench-toml.c — TOML parse speed beside a peer, Python's tomllib.
 *
 * Usage: bench-toml [MEGABYTES] (default 10). Generates a config-like
 * document (many [sections] with strings, numbers, arrays and inline tables,
 * a large flat table and a long [[array]] of tables), parses it with
 * spn_toml_parse (best of 5) and with `python3 -c tomllib.loads` on the same
 * bytes (best of 3, timed inside Python so interpreter start-up is not
 * counted), and prints both and the ratio. Not a test: it gates nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "spindle/toml.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *generate(size_t target, size_t *len) {
  size_t cap = target + 4096, n = 0, i;
  char *s = malloc(cap);
  if (!s)
    return NULL;
  n += (size_t)snprintf(s + n, cap - n, "[flat]\n");
  for (i = 0; n < target / 10; i++)
    n += (size_t)snprintf(s + n, cap - n, "k%zu = %zu\n", i, i * 7);
  for (i = 0; n < target / 5; i++)
    n += (size_t)snprintf(s + n, cap - n, "[[jobs]]\nid = %zu\nname = \"job %zu\"\n", i, i);
  for (i = 0; n + 200 < target; i++)
    n += (size_t)snprintf(s + n, cap - n,
                          "[section_%zu]\nname = \"stage-%zu\" # comment\nvalue = %zu\nratio = %zu.5\n"
                          "list = [1, 2, 3, \"x\"]\ninline = { a = %zu, b.c = true }\n",
                          i, i, i, i, i);
  *len = n;
  return s;
}

int main(int argc, char **argv) {
  size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 10;
  if (mb == 0 || mb > 1024) {
    fprintf(stderr, "usage: bench-toml [MEGABYTES 1..1024]\n");
    return 2;
  }
  size_t len;
  char *src = generate(mb << 20, &len);
  if (!src)
    return 1;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    spn_error_t err = SPN_ERROR_INIT;
    spn_toml_doc_t *doc = NULL;
    double t0 = now_s();
    if (spn_toml_parse(src, len, "bench.toml", &doc, &err) != SPN_OK) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    double t = now_s() - t0;
    if (t < best)
      best = t;
    spn_toml_doc_free(&doc);
  }
  printf("spindle spn_toml_parse: %.2f MB in %.3f s (%.1f MB/s)\n", (double)len / 1e6, best, (double)len / 1e6 / best);

  char path[] = "/tmp/bench-toml-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, src, len) != (ssize_t)len) {
    perror("bench-toml: temp file");
    return 1;
  }
  close(fd);
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import sys,time,tomllib\n"
           "d=open(sys.argv[1],\"rb\").read().decode()\n"
           "b=1e30\n"
           "for _ in range(3):\n"
           " t=time.perf_counter(); tomllib.loads(d); b=min(b,time.perf_counter()-t)\n"
           "print(b)' %s 2>/dev/null",
           path);
  FILE *p = popen(cmd, "r");
  double peer = 0;
  if (!p || fscanf(p, "%lf", &peer) != 1)
    peer = 0;
  if (p)
    pclose(p);
  remove(path);
  if (peer > 0) {
    printf("python3 tomllib.loads:  %.2f MB in %.3f s (%.1f MB/s)\n", (double)len / 1e6, peer,
           (double)len / 1e6 / peer);
    printf("ratio: spindle is %.1fx faster\n", peer / best);
  } else {
    printf("python3 tomllib.loads: unavailable (needs Python 3.11+)\n");
  }
  free(src);
  return 0;
}
