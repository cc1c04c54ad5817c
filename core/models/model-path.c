/* model-path.c — the model search list and name resolution (model-path.h).
 *
 * Reads only the environment and the file system; every call recomputes the
 * list, so a test (or a job) that changes SPINDLE_MODEL_PATH sees it at once.
 */
#include "model-path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SPN_MODELS_INSTALL_DIR
#define SPN_MODELS_INSTALL_DIR ""
#endif
/* The install's bindir and models folder relative to its prefix ("bin",
 * "share/spindle/models"): a relocated install (the portable archive
 * unpacked anywhere) finds its models beside the program that runs. */
#ifndef SPN_MODELS_BINDIR
#define SPN_MODELS_BINDIR ""
#endif
#ifndef SPN_MODELS_REL_DIR
#define SPN_MODELS_REL_DIR ""
#endif

bool spn_models_is_name(const char *s) {
  if (!s || !*s || *s == '-' || strlen(s) > 100)
    return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
      return false;
  return true;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* $XDG_<kind>_HOME/SUB when that variable is absolute (the XDG spec
 * ignores a relative one), else ~/HOME_REL/SUB. */
static int xdg_dir(char *out, size_t outsz, const char *var, const char *home_rel, const char *sub) {
  const char *xdg = getenv(var), *home = getenv("HOME");
  int n;
  if (xdg && *xdg == '/')
    n = snprintf(out, outsz, "%s/%s", xdg, sub);
  else if (home && *home)
    n = snprintf(out, outsz, "%s/%s/%s", home, home_rel, sub);
  else
    return -1;
  return n > 0 && (size_t)n < outsz ? 0 : -1;
}

/* The user data directory for models (list entry 2). */
static int user_dir(char *out, size_t outsz) {
  return xdg_dir(out, outsz, "XDG_DATA_HOME", ".local/share", "spindle/models");
}

int spn_models_cache_dir(char *out, size_t outsz) {
  const char *env = getenv("SPINDLE_CACHE_DIR");
  if (env && *env) {
    int n = snprintf(out, outsz, "%s", env);
    return n > 0 && (size_t)n < outsz ? 0 : -1;
  }
  return xdg_dir(out, outsz, "XDG_CACHE_HOME", ".cache", "spindle");
}

int spn_models_mkdir_p(const char *dir) {
  char tmp[4096];
  int n = snprintf(tmp, sizeof tmp, "%s", dir);
  if (n <= 0 || (size_t)n >= sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST)
        return -1;
      *p = '/';
    }
  return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

int spn_models_store_dir(char *out, size_t outsz, char *msg, size_t msz) {
  const char *env = getenv("SPINDLE_MODEL_PATH");
  if (env && *env) {
    size_t n = strcspn(env, ":");
    if (n + 1 > outsz) {
      snprintf(msg, msz, "SPINDLE_MODEL_PATH: first directory too long");
      return -1;
    }
    memcpy(out, env, n);
    out[n] = 0;
    return 0;
  }
  if (user_dir(out, outsz)) {
    snprintf(msg, msz, "no models directory: set SPINDLE_MODEL_PATH, XDG_DATA_HOME or HOME");
    return -1;
  }
  return 0;
}

/* PREFIX/share/spindle/models when this program is PREFIX/bin/NAME, with
 * PREFIX not the built-in one (that one is tried already). */
static int relocated_dir(char *out, size_t outsz) {
  const char *bindir = SPN_MODELS_BINDIR, *rel = SPN_MODELS_REL_DIR;
  if (!*bindir || *bindir == '/' || !*rel || *rel == '/')
    return -1;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return -1;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash)
    return -1;
  *slash = '\0'; /* the program's folder: PREFIX/bindir? */
  size_t len = strlen(exe), bl = strlen(bindir);
  if (len <= bl || exe[len - bl - 1] != '/' || strcmp(exe + len - bl, bindir))
    return -1;
  exe[len - bl - 1] = '\0';
  int m = snprintf(out, outsz, "%s/%s", exe, rel);
  if (m <= 0 || (size_t)m >= outsz || !strcmp(out, SPN_MODELS_INSTALL_DIR))
    return -1;
  return 0;
}

int spn_models_install_file(const char *file, char *out, size_t outsz) {
  const char *inst = SPN_MODELS_INSTALL_DIR;
  int n;
  if (*inst) {
    n = snprintf(out, outsz, "%s/%s", inst, file);
    if (n > 0 && (size_t)n < outsz && is_file(out))
      return 0;
  }
  char dir[PATH_MAX];
  if (relocated_dir(dir, sizeof dir) == 0) {
    n = snprintf(out, outsz, "%s/%s", dir, file);
    if (n > 0 && (size_t)n < outsz && is_file(out))
      return 0;
  }
  return -1;
}

/* Try DIR/NAME.onnx; dir of length dlen. */
static bool try_dir(const char *dir, size_t dlen, const char *name, char *out, size_t outsz) {
  if (!dlen)
    return false;
  int n = snprintf(out, outsz, "%.*s/%s.onnx", (int)dlen, dir, name);
  return n > 0 && (size_t)n < outsz && is_file(out);
}

int spn_models_find(const char *name, char *out, size_t outsz, char *msg, size_t msz) {
  if (!spn_models_is_name(name)) {
    snprintf(msg, msz, "'%s' is not a model name (lowercase letters, digits and dashes)", name ? name : "");
    return -1;
  }
  const char *env = getenv("SPINDLE_MODEL_PATH");
  char looked[1024] = "";
  size_t lk = 0;
  if (env && *env) {
    for (const char *p = env; *p;) {
      size_t n = strcspn(p, ":");
      if (try_dir(p, n, name, out, outsz))
        return 0;
      p += n + (p[n] == ':');
    }
    lk += (size_t)snprintf(looked + lk, sizeof looked - lk, "SPINDLE_MODEL_PATH=%s", env);
  }
  char dir[4096];
  if (!user_dir(dir, sizeof dir)) {
    if (try_dir(dir, strlen(dir), name, out, outsz))
      return 0;
    if (lk < sizeof looked)
      lk += (size_t)snprintf(looked + lk, sizeof looked - lk, "%s%s", lk ? ", " : "", dir);
  }
  const char *inst = SPN_MODELS_INSTALL_DIR;
  if (try_dir(inst, strlen(inst), name, out, outsz))
    return 0;
  if (*inst && lk < sizeof looked)
    lk += (size_t)snprintf(looked + lk, sizeof looked - lk, "%s%s", lk ? ", " : "", inst);
  if (relocated_dir(dir, sizeof dir) == 0) {
    if (try_dir(dir, strlen(dir), name, out, outsz))
      return 0;
    if (lk < sizeof looked)
      snprintf(looked + lk, sizeof looked - lk, "%s%s", lk ? ", " : "", dir);
  }
  snprintf(msg, msz, "model '%s' is not fetched (looked in %s); run: spindle model fetch %s", name, looked, name);
  return -1;
}

int spn_models_resolve(const char *value, char *out, size_t outsz, char *msg, size_t msz) {
  if (!value || !*value) {
    snprintf(msg, msz, "empty model");
    return -1;
  }
  if (is_file(value)) {
    int n = snprintf(out, outsz, "%s", value);
    if (n < 0 || (size_t)n >= outsz) {
      snprintf(msg, msz, "model path too long");
      return -1;
    }
    return 0;
  }
  const char *base = strrchr(value, '/');
  base = base ? base + 1 : value;
  if (spn_models_is_name(base))
    return spn_models_find(base, out, outsz, msg, msz);
  snprintf(msg, msz, "%s: no such model file", value);
  return -1;
}
