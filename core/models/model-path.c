/* model-path.c — the model search list and name resolution (model-path.h).
 *
 * Reads only the environment and the file system; every call recomputes the
 * list, so a test (or a job) that changes SPINDLE_MODEL_PATH sees it at once.
 */
#include "model-path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef SPN_MODELS_INSTALL_DIR
#define SPN_MODELS_INSTALL_DIR ""
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

/* The user data directory for models (list entry 2). */
static int user_dir(char *out, size_t outsz) {
  const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
  int n;
  if (xdg && *xdg == '/')
    n = snprintf(out, outsz, "%s/spindle/models", xdg);
  else if (home && *home)
    n = snprintf(out, outsz, "%s/.local/share/spindle/models", home);
  else
    return -1;
  return n > 0 && (size_t)n < outsz ? 0 : -1;
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
    snprintf(looked + lk, sizeof looked - lk, "%s%s", lk ? ", " : "", inst);
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
