/* paths.c — confining job inputs and outputs to configured root directories.
 *
 * Security-sensitive: a job names files on the gateway's host, so every path
 * is resolved with realpath() (following every symlink and "..") and the
 * result must lie inside a root, compared component-wise ("/data" does not
 * contain "/database"). Outputs do not exist yet, so their directory is
 * resolved and the file name checked on its own. Rejection rules are written
 * where they are enforced below.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jobs-internal.h"

int32_t spn__roots_add(spn_roots_t *r, const char *dir, spn_error_t *err) {
  char *real = realpath(dir, NULL);
  if (!real)
    return spn_error_set(err, SPN_ENOENT, "root %s: %s", dir, strerror(errno));
  struct stat st;
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    free(real);
    return spn_error_set(err, SPN_EINVAL, "root %s: not a directory", dir);
  }
  char **nv = realloc(r->dirs, (r->n + 1) * sizeof *nv);
  if (!nv) {
    free(real);
    return spn_error_set(err, SPN_ENOMEM, "root %s: out of memory", dir);
  }
  r->dirs = nv;
  r->dirs[r->n++] = real;
  return SPN_OK;
}

void spn__roots_free(spn_roots_t *r) {
  for (size_t i = 0; i < r->n; i++)
    free(r->dirs[i]);
  free(r->dirs);
  r->dirs = NULL;
  r->n = 0;
}

static bool inside(const spn_roots_t *r, const char *real) {
  for (size_t i = 0; i < r->n; i++) {
    size_t n = strlen(r->dirs[i]);
    if (n == 1 && r->dirs[i][0] == '/')
      return true; /* root "/" holds everything */
    if (!strncmp(real, r->dirs[i], n) && (real[n] == '/' || real[n] == '\0'))
      return true;
  }
  return false;
}

int32_t spn__confine_input(const spn_roots_t *r, const char *path, char **out, spn_error_t *err) {
  *out = NULL;
  /* Rule: relative paths mean nothing on the gateway's host. */
  if (!path || path[0] != '/')
    return spn_error_set(err, SPN_EINVAL, "input %s: path must be absolute", path ? path : "(null)");
  char *real = realpath(path, NULL);
  if (!real)
    return spn_error_set(err, SPN_ENOENT, "input %s: %s", path, strerror(errno));
  struct stat st;
  /* Rule: only regular files (no devices, fifos or directories). */
  if (stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
    free(real);
    return spn_error_set(err, SPN_EINVAL, "input %s: not a regular file", path);
  }
  /* Rule: after resolving links and "..", the file must be inside a root. */
  if (!inside(r, real)) {
    free(real);
    return spn_error_set(err, SPN_EPERM, "input %s: outside the allowed input roots", path);
  }
  *out = real;
  return SPN_OK;
}

int32_t spn__confine_output(const spn_roots_t *r, const char *path, char **out, spn_error_t *err) {
  *out = NULL;
  if (!path || path[0] != '/')
    return spn_error_set(err, SPN_EINVAL, "output %s: path must be absolute", path ? path : "(null)");
  const char *slash = strrchr(path, '/');
  const char *base = slash + 1;
  /* Rule: a real file name, not ".", ".." or empty (a directory). */
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return spn_error_set(err, SPN_EINVAL, "output %s: not a file name", path);
  if (strlen(path) >= PATH_MAX - 64)
    return spn_error_set(err, SPN_EINVAL, "output %s: path too long", path);
  char dir[PATH_MAX];
  size_t dl = (size_t)(slash - path);
  memcpy(dir, path, dl);
  dir[dl ? dl : 1] = '\0';
  if (!dl)
    dir[0] = '/';
  char *rdir = realpath(dir, NULL);
  if (!rdir)
    return spn_error_set(err, SPN_ENOENT, "output %s: directory: %s", path, strerror(errno));
  /* Rule: the directory, links resolved, must be inside a root. */
  if (!inside(r, rdir)) {
    free(rdir);
    return spn_error_set(err, SPN_EPERM, "output %s: outside the allowed output roots", path);
  }
  size_t n = strlen(rdir) + strlen(base) + 2;
  char *full = malloc(n);
  if (!full) {
    free(rdir);
    return spn_error_set(err, SPN_ENOMEM, "output %s: out of memory", path);
  }
  snprintf(full, n, "%s/%s", strcmp(rdir, "/") ? rdir : "", base);
  free(rdir);
  /* Rule: never write through an existing symlink, or over a directory. */
  struct stat st;
  if (lstat(full, &st) == 0 && (S_ISLNK(st.st_mode) || !S_ISREG(st.st_mode))) {
    free(full);
    return spn_error_set(err, SPN_EPERM, "output %s: exists and is not a regular file", path);
  }
  *out = full;
  return SPN_OK;
}
