/* replay-toml.c — run every file of the toml-test corpus through the parser.
 *
 * Usage: replay-toml CORPUS_DIR (the toml-test folder: valid/ and invalid/).
 * Files under valid/ must parse; files under invalid/ must fail with
 * SPN_EPARSE and a message "NAME:LINE:COL: reason" whose line and column lie
 * inside the file. This is the fuzzer's seed corpus replayed in the normal
 * build, so a regression shows up without clang or libFuzzer. Exit 77 (skip)
 * when the corpus is not there. TOML_TEST_CONFORMANCE, when set, names the
 * conformance folder instead (the corpus is its toml-test/).
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "spindle/toml.h"

typedef struct replay {
  size_t root_len;
  unsigned valid_ok, invalid_ok, failures;
} replay_t;

/* nftw has no user pointer; this program is single-threaded. */
static replay_t *g_replay;

static bool read_all(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return false;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  for (;;) {
    if (n == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) {
        free(b);
        fclose(f);
        return false;
      }
      b = nb;
    }
    size_t got = fread(b + n, 1, cap - n, f);
    if (!got)
      break;
    n += got;
  }
  fclose(f);
  *out = b;
  *len = n;
  return true;
}

static int visit(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  replay_t *r = g_replay;
  size_t pl = strlen(path);
  if (flag != FTW_F || pl < 5 || strcmp(path + pl - 5, ".toml") != 0)
    return 0;
  const char *rel = path + r->root_len + 1;
  bool valid = strncmp(rel, "valid/", 6) == 0;
  char *src;
  size_t len;
  if (!read_all(path, &src, &len)) {
    printf("FAIL %s: cannot read\n", rel);
    r->failures++;
    return 0;
  }
  unsigned lines = 1;
  for (size_t i = 0; i < len; i++)
    lines += src[i] == '\n';
  spn_error_t err = SPN_ERROR_INIT;
  spn_toml_doc_t *doc = NULL;
  int32_t rc = spn_toml_parse(src, len, rel, &doc, &err);
  free(src);
  if (valid) {
    if (rc == SPN_OK && doc) {
      r->valid_ok++;
    } else {
      printf("FAIL %s: valid file rejected: %s\n", rel, err.msg);
      r->failures++;
    }
  } else {
    size_t nl = strlen(rel);
    unsigned line = 0, col = 0;
    char colon = 0;
    if (rc == SPN_EPARSE && !doc && strncmp(err.msg, rel, nl) == 0 &&
        sscanf(err.msg + nl, ":%u:%u%c", &line, &col, &colon) == 3 && colon == ':' && line >= 1 && line <= lines &&
        col >= 1) {
      r->invalid_ok++;
    } else {
      printf("FAIL %s: want \"%s:LINE:COL: ...\", got status %d: %s\n", rel, rel, rc, err.msg);
      r->failures++;
    }
  }
  spn_toml_doc_free(&doc);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: replay-toml TOML_TEST_DIR\n");
    return 2;
  }
  /* Like run-conformance.py: TOML_TEST_CONFORMANCE overrides the folder. */
  char over[4096];
  const char *env = getenv("TOML_TEST_CONFORMANCE");
  if (env && *env) {
    snprintf(over, sizeof over, "%s/toml-test", env);
    argv[1] = over;
  }
  struct stat st;
  if (stat(argv[1], &st) != 0 || !S_ISDIR(st.st_mode)) {
    printf("corpus %s not found: skipped\n", argv[1]);
    return 77;
  }
  replay_t r = {.root_len = strlen(argv[1])};
  while (r.root_len > 1 && argv[1][r.root_len - 1] == '/')
    r.root_len--;
  g_replay = &r;
  if (nftw(argv[1], visit, 16, FTW_PHYS) != 0) {
    fprintf(stderr, "cannot walk %s\n", argv[1]);
    return 1;
  }
  printf("replay: %u valid parsed, %u invalid rejected with a position, %u failures\n", r.valid_ok, r.invalid_ok,
         r.failures);
  return r.failures == 0 && r.valid_ok > 0 && r.invalid_ok > 0 ? 0 : 1;
}
