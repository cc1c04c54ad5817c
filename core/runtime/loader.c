/* loader.c — loading stage plugins (dlopen) and refusing the ones that
 * would not work with this host.
 *
 * A plugin is `libspindle-<name>.so` exporting `spindle_plugin_<name>_desc`.
 * Loading one is the most trust-sensitive thing the runtime does: the file
 * is foreign code built against some version of spindle/plugin.h, and a
 * mismatch caught late turns into memory corruption far from its cause. So
 * every rule of plugin.h is checked here, in the order that lets each check
 * read only what an earlier one proved readable, and every refusal names
 * the file and the rule ("(rule: ...)") so the author knows what to fix.
 *
 * Plugins are opened RTLD_NOW (an unresolved symbol fails now, not in the
 * middle of a job) and RTLD_LOCAL (two plugins never see each other's
 * symbols). A refused plugin is fully undone: its kinds are removed and the
 * file is closed. Nothing here is process-wide: the registry is the
 * caller's; only getenv() is read.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "registry-internal.h"

#ifndef SPN_PLUGINDIR
#define SPN_PLUGINDIR "/usr/local/lib/spindle-1"
#endif
/* CUDA major of this host build (meson sets it when CUDA is enabled). */
#ifndef SPN_HOST_CUDA_MAJOR
#define SPN_HOST_CUDA_MAJOR 0
#endif

/* The first size of spn_plugin_desc_t (ABI 1.0). */
#define SPN__DESC_V1_0_SIZE sizeof(spn_plugin_desc_t)

/* ---- the loader's half of the host API --------------------------------- */

int32_t spn__plugin_register_kind(spn_plugin_t *plugin, const spn_stage_kind_t *kind, spn_error_t *err) {
  if (!plugin)
    return spn_error_set(err, SPN_EINVAL, "register_kind: NULL plugin");
  /* Kinds are only accepted while init runs: afterwards the registry may be
   * read by pipelines on other threads. */
  if (!plugin->in_init)
    return spn_error_set(err, SPN_ESTATE, "%s: register_kind outside init (rule: init)", plugin->path);
  spn_error_t e = SPN_ERROR_INIT;
  int32_t rc = spn__registry_check_kind(plugin->reg, kind, plugin->path, &e);
  if (rc == SPN_OK)
    rc = spn__registry_insert(plugin->reg, kind, plugin->path, plugin, &e);
  if (rc != SPN_OK) {
    /* Remember the first refusal: a plugin that ignores it and returns OK
     * from init is still refused (a half-registered plugin is a trap). */
    if (plugin->refused == SPN_OK) {
      plugin->refused = rc;
      memcpy(plugin->refusal, e.msg, sizeof plugin->refusal);
    }
    if (err)
      *err = e;
  }
  return rc;
}

void spn__plugin_set_data(spn_plugin_t *plugin, void *data) {
  if (plugin)
    plugin->data = data;
}

static const spn_host_api_t loader_host_api = {
    .struct_size = sizeof(spn_host_api_t),
    .abi_major = SPN_PLUGIN_ABI_MAJOR,
    .abi_minor = SPN_PLUGIN_ABI_MINOR,
    .register_kind = spn__plugin_register_kind,
    .plugin_set_data = spn__plugin_set_data,
};

const spn_host_api_t *spn__loader_host_api(void) { return &loader_host_api; }

/* ---- loading one file --------------------------------------------------- */

/* <name> from ".../libspindle-<name>.so": it becomes part of a C symbol, so
 * only lowercase letters, digits and '_' are accepted. Returns a malloc'd
 * name, or NULL (bad name) with *bad set. */
static char *name_from_path(const char *path, bool *nomem) {
  *nomem = false;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  static const char prefix[] = "libspindle-", suffix[] = ".so";
  size_t bl = strlen(base), pl = sizeof prefix - 1, sl = sizeof suffix - 1;
  if (bl <= pl + sl || strncmp(base, prefix, pl) || strcmp(base + bl - sl, suffix))
    return NULL;
  size_t nl = bl - pl - sl;
  for (size_t i = 0; i < nl; i++) {
    char c = base[pl + i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return NULL;
  }
  char *name = strndup(base + pl, nl);
  if (!name)
    *nomem = true;
  return name;
}

void spn__plugin_unload(spn_plugin_t *p) {
  if (!p)
    return;
  if (p->desc && p->desc->fini)
    p->desc->fini(p->data);
  spn__registry_remove_plugin_kinds(p->reg, p);
  if (p->dl)
    dlclose(p->dl);
  free(p->path);
  free(p->name);
  free(p);
}

/* The descriptor rules of plugin.h, in an order where each check only reads
 * fields an earlier check proved present. */
static int32_t check_desc(const spn_plugin_t *p, const spn_plugin_desc_t *d, spn_error_t *err) {
  const char *f = p->path;
  /* struct_size, abi_major and abi_minor sit at the same offsets in every
   * ABI version: reading the majors needs 12 bytes, nothing more. */
  if (d->struct_size < 3 * sizeof(uint32_t))
    return spn_error_set(err, SPN_EABI, "%s: refused: descriptor struct_size %u is too small (rule: struct_size)", f,
                         d->struct_size);
  /* A different major means a different layout: stop before reading more. */
  if (d->abi_major != SPN_PLUGIN_ABI_MAJOR)
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: built for plugin ABI %u.%u, this host has ABI %d.%d "
                         "(rule: ABI major must match)",
                         f, d->abi_major, d->abi_minor, SPN_PLUGIN_ABI_MAJOR, SPN_PLUGIN_ABI_MINOR);
  /* A newer minor may rely on host API members this host does not have. */
  if (d->abi_minor > SPN_PLUGIN_ABI_MINOR)
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: built for plugin ABI %u.%u, newer than this host's %d.%d "
                         "(rule: ABI minor must not be newer)",
                         f, d->abi_major, d->abi_minor, SPN_PLUGIN_ABI_MAJOR, SPN_PLUGIN_ABI_MINOR);
  /* Smaller than 1.0: fields we read would be past its end. Larger than we
   * know: it comes from a newer header and we cannot honour the rest. */
  if (d->struct_size < SPN__DESC_V1_0_SIZE || d->struct_size > sizeof(spn_plugin_desc_t))
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: descriptor struct_size %u, this host accepts %zu..%zu "
                         "(rule: struct_size)",
                         f, d->struct_size, SPN__DESC_V1_0_SIZE, sizeof(spn_plugin_desc_t));
  /* Pointer size: a 32-bit build's structs do not line up with ours. CUDA:
   * a plugin built without CUDA (0) runs anywhere; one built against CUDA N
   * needs a host built against the same major (runtime and driver API
   * objects are not compatible across majors). */
  if (d->sig_pointer_size != sizeof(void *) ||
      (d->sig_cuda_major != 0 && d->sig_cuda_major != (uint32_t)SPN_HOST_CUDA_MAJOR))
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: build signature (pointer size %u, CUDA %u) does not match this host's "
                         "(pointer size %zu, CUDA %d) (rule: build signature)",
                         f, d->sig_pointer_size, d->sig_cuda_major, sizeof(void *), SPN_HOST_CUDA_MAJOR);
  bool reserved_ok = d->reserved0 == 0;
  for (size_t i = 0; i < sizeof d->reserved / sizeof d->reserved[0]; i++)
    reserved_ok = reserved_ok && d->reserved[i] == NULL;
  if (!reserved_ok)
    return spn_error_set(err, SPN_EABI, "%s: refused: reserved descriptor fields are not zero (rule: reserved zero)",
                         f);
  /* The name ties the file to its symbol: a renamed file would otherwise
   * load under a name its author never chose. */
  if (!d->name || strcmp(d->name, p->name))
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: descriptor name \"%s\" does not match \"%s\" from the file name "
                         "(rule: name must match the file)",
                         f, d->name ? d->name : "(null)", p->name);
  if (!d->init)
    return spn_error_set(err, SPN_EABI, "%s: refused: descriptor has no init (rule: init)", f);
  return SPN_OK;
}

/* The runtime's complete table (host.c). */
const spn_host_api_t *spn__host_api(void);

int32_t spn__registry_load_file(spn__registry_t *reg, const spn_host_api_t *host, const char *path,
                                spn_error_t *err) {
  /* init always gets the complete table (rule of ABI 1.1): a plugin may
   * keep it and call any member, so no caller may hand it a partial one. */
  if (!host)
    host = spn__host_api();
  bool nomem;
  char *name = name_from_path(path, &nomem);
  if (!name) {
    if (nomem)
      return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    return spn_error_set(err, SPN_EABI,
                         "%s: refused: a plugin file is named libspindle-<name>.so, <name> in [a-z0-9_] "
                         "(rule: file name)",
                         path);
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    free(name);
    return spn_error_set(err, e == ENOENT ? SPN_ENOENT : SPN_EIO, "%s: cannot load plugin: %s", path, strerror(e));
  }
  /* Loading one name twice would run its init twice on one dlopen handle
   * (dlopen returns the same object) and register every kind twice. The
   * very same file again (a folder listed twice in a search path) is
   * already done; another file with a loaded name is refused. */
  for (size_t i = 0; i < reg->n_plugins; i++) {
    const spn_plugin_t *q = reg->plugins[i];
    if (strcmp(q->name, name))
      continue;
    bool same = q->dev == st.st_dev && q->ino == st.st_ino;
    free(name);
    if (same)
      return SPN_OK;
    return spn_error_set(err, SPN_EEXIST,
                         "%s: refused: a plugin named \"%s\" is already loaded from %s (rule: duplicate plugin)", path,
                         q->name, q->path);
  }
  int32_t rc = SPN_OK;
  spn_plugin_t *p = calloc(1, sizeof *p);
  if (!p) {
    free(name);
    return spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
  }
  p->reg = reg;
  p->name = name;
  /* dlopen searches LD_LIBRARY_PATH for a bare file name: make it a path. */
  if (!strchr(path, '/')) {
    size_t n = strlen(path) + 3;
    p->path = malloc(n);
    if (p->path)
      snprintf(p->path, n, "./%s", path);
  } else {
    p->path = strdup(path);
  }
  if (!p->path) {
    rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
    goto out_free;
  }
  if (reg->n_plugins == reg->cap_plugins) {
    size_t cap = reg->cap_plugins ? reg->cap_plugins * 2 : 8;
    spn_plugin_t **ps = realloc(reg->plugins, cap * sizeof *ps);
    if (!ps) {
      rc = spn_error_set(err, SPN_ENOMEM, "%s: out of memory", path);
      goto out_free;
    }
    reg->plugins = ps;
    reg->cap_plugins = cap;
  }
  p->dev = st.st_dev;
  p->ino = st.st_ino;
  p->dl = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
  if (!p->dl) {
    const char *why = dlerror();
    rc = spn_error_set(err, SPN_EIO, "%s: refused: cannot load: %s (rule: loadable)", path, why ? why : "?");
    goto out_free;
  }
  char sym[160];
  snprintf(sym, sizeof sym, "spindle_plugin_%s_desc", name);
  dlerror();
  void *fn_ptr = dlsym(p->dl, sym);
  if (!fn_ptr) {
    rc = spn_error_set(err, SPN_EABI, "%s: refused: no symbol %s (rule: descriptor symbol)", path, sym);
    goto out_close;
  }
  /* ISO C forbids converting void* to a function pointer; POSIX requires
   * dlsym results to be callable. memcpy keeps -Wpedantic quiet. */
  const spn_plugin_desc_t *(*desc_fn)(void);
  memcpy(&desc_fn, &fn_ptr, sizeof desc_fn);
  const spn_plugin_desc_t *d = desc_fn();
  if (!d) {
    rc = spn_error_set(err, SPN_EABI, "%s: refused: %s() returned NULL (rule: descriptor symbol)", path, sym);
    goto out_close;
  }
  rc = check_desc(p, d, err);
  if (rc != SPN_OK)
    goto out_close;
  p->desc = d;

  /* register_kind and plugin_set_data act on the loader's spn_plugin_t: a
   * table that does not point them here, or that is not complete (a test's
   * stand-in, an older table), gets a copy that does: the complete table
   * with the caller's non-NULL members laid over it. The copy lives as long
   * as the plugin is loaded (plugins keep the pointer). */
  const spn_host_api_t *full = spn__host_api();
  if (host != full) {
    size_t n = host->struct_size < sizeof p->host ? host->struct_size : sizeof p->host;
    p->host = *full;
    /* Member by member (the table is a header and function pointers):
     * a NULL member of the caller keeps the complete table's. */
    size_t first = offsetof(spn_host_api_t, register_kind);
    for (size_t off = first; off + sizeof(void (*)(void)) <= n; off += sizeof(void (*)(void))) {
      void (*fn)(void);
      memcpy(&fn, (const char *)host + off, sizeof fn);
      if (fn)
        memcpy((char *)&p->host + off, &fn, sizeof fn);
    }
    p->host.register_kind = spn__plugin_register_kind;
    p->host.plugin_set_data = spn__plugin_set_data;
    host = &p->host;
  }
  spn_error_t ie = SPN_ERROR_INIT;
  p->in_init = true;
  int32_t irc = d->init(host, p, &ie);
  p->in_init = false;
  if (irc != SPN_OK) {
    /* init failed: it undid itself (fini is only for a successful init). */
    p->desc = NULL;
    spn__registry_remove_plugin_kinds(reg, p);
    rc = spn_error_set(err, irc < 0 ? irc : SPN_EINTERNAL, "%s: refused: init failed: %s (rule: init must succeed)",
                       path, ie.msg[0] ? ie.msg : spn_strerror(irc));
    goto out_close;
  }
  if (p->refused != SPN_OK) {
    /* A kind was refused but init went on: refuse the plugin as a whole
     * (fini runs, init having succeeded). */
    rc = spn_error_set(err, p->refused, "%s", p->refusal);
    spn__plugin_unload(p);
    return rc;
  }
  reg->plugins[reg->n_plugins++] = p;
  return SPN_OK;

out_close:
  dlclose(p->dl);
out_free:
  free(p->path);
  free(p->name);
  free(p);
  return rc;
}

/* ---- the search path ----------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Load the libspindle-*.so files of one folder, in name order. Keeps the
 * first refusal in *first (code in first->code). */
static void load_dir(spn__registry_t *reg, const spn_host_api_t *host, const char *dir, spn_error_t *first) {
  DIR *dh = opendir(dir);
  if (!dh)
    return; /* a folder that is not there holds no plugins */
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(dh))) {
    bool nomem;
    char *pname = name_from_path(de->d_name, &nomem);
    if (!pname)
      continue;
    bool loaded = spn__registry_has_plugin(reg, pname);
    free(pname);
    if (loaded)
      continue; /* shadowed by an earlier folder */
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn)
        break;
      names = nn;
    }
    size_t len = strlen(dir) + strlen(de->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n])
      break;
    snprintf(names[n], len, "%s/%s", dir, de->d_name);
    n++;
  }
  closedir(dh);
  if (n)
    qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    spn_error_t e = SPN_ERROR_INIT;
    int32_t rc = spn__registry_load_file(reg, host, names[i], &e);
    if (rc != SPN_OK && first->code == SPN_OK)
      *first = e;
    free(names[i]);
  }
  free(names);
}

int32_t spn__registry_load_search_path(spn__registry_t *reg, const spn_host_api_t *host, const char *const *dirs,
                                       size_t n_dirs, const char *const *config_dirs, size_t n_config_dirs,
                                       spn_error_t *err) {
  spn_error_t first = SPN_ERROR_INIT;
  for (size_t i = 0; i < n_dirs; i++)
    if (dirs[i] && *dirs[i])
      load_dir(reg, host, dirs[i], &first);
  const char *env = getenv("SPINDLE_PLUGIN_PATH");
  if (env && *env) {
    char *copy = strdup(env);
    if (!copy)
      return spn_error_set(err, SPN_ENOMEM, "SPINDLE_PLUGIN_PATH: out of memory");
    char *save = NULL;
    for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save))
      load_dir(reg, host, tok, &first);
    free(copy);
  }
  for (size_t i = 0; i < n_config_dirs; i++)
    if (config_dirs[i] && *config_dirs[i])
      load_dir(reg, host, config_dirs[i], &first);
  /* The plugin folder beside this library (lib/<arch>/spindle-1 next to
   * libspindle.so): an install moved elsewhere, or the portable archive of
   * tools/bundle.sh, finds its own stages before the compiled-in folder. */
  Dl_info self;
  const char *base = strrchr(SPN_PLUGINDIR, '/');
  if (base && dladdr((void *)spn__registry_load_search_path, &self) && self.dli_fname) {
    const char *slash = strrchr(self.dli_fname, '/');
    if (slash) {
      size_t len = (size_t)(slash - self.dli_fname) + strlen(base) + 1;
      char *beside = malloc(len);
      if (beside) {
        snprintf(beside, len, "%.*s%s", (int)(slash - self.dli_fname), self.dli_fname, base);
        load_dir(reg, host, beside, &first);
        free(beside);
      }
    }
  }
  load_dir(reg, host, SPN_PLUGINDIR, &first);
  if (first.code != SPN_OK) {
    if (err)
      *err = first;
    return first.code;
  }
  return SPN_OK;
}
