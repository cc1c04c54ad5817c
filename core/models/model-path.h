/* model-path.h — where models fetched by name live, and how a name or a
 * path in a config becomes a file.
 *
 * A model name is what models/manifest.toml lists ("retinaface-mnet025"):
 * lowercase letters, digits and dashes. The fetched file is NAME.onnx in
 * the first directory of the search list that has it:
 *   1. each directory of $SPINDLE_MODEL_PATH (colon-separated), if set;
 *   2. $XDG_DATA_HOME/spindle/models, or ~/.local/share/spindle/models;
 *   3. the install's share/spindle/models (built in), then, when the
 *      program runs from PREFIX/bin of another prefix (the portable archive
 *      unpacked elsewhere), PREFIX/share/spindle/models.
 * `spindle model fetch` stores into the first directory of
 * $SPINDLE_MODEL_PATH when set, else into (2).
 *
 * Also here: Spindle's per-user cache directory (the CUDA engine's cuDNN
 * algorithm cache) and creating a directory with its parents, for
 * `spindle model fetch` and that cache alike.
 *
 * Nothing here links libspindle (the vision plugin uses it too; libspindle
 * links it); no state is kept between calls.
 */
#ifndef SPINDLE_MODELS_MODEL_PATH_H
#define SPINDLE_MODELS_MODEL_PATH_H

#include <stdbool.h>
#include <stddef.h>

/* Spindle's cache directory (not created): $SPINDLE_CACHE_DIR, else
 * $XDG_CACHE_HOME/spindle (an absolute one, as the XDG spec asks), else
 * ~/.cache/spindle. Returns 0, or -1 when none is set or it does not fit.
 * Thread: any. */
int spn_models_cache_dir(char *out, size_t outsz);

/* Create dir and every missing parent (mode 0755). Returns 0 when it exists
 * afterwards, -1 otherwise (errno set). Thread: any. */
int spn_models_mkdir_p(const char *dir);

/* True when s is a model name (not a path). Thread: any. */
bool spn_models_is_name(const char *s);

/* The directory `fetch` stores into (not created). Returns 0, or -1 with
 * msg when neither $SPINDLE_MODEL_PATH, $XDG_DATA_HOME nor $HOME is set.
 * Thread: any. */
int spn_models_store_dir(char *out, size_t outsz, char *msg, size_t msz);

/* Find NAME.onnx along the search list. Returns 0 with the path in out, or
 * -1 with msg saying where it looked and how to fetch it. Thread: any. */
int spn_models_find(const char *name, char *out, size_t outsz, char *msg, size_t msz);

/* FILE (a file name, e.g. "espcn-x2.onnx") in the install's models folder:
 * the built-in one, then the relocated one (list entry 3). Returns 0 with
 * the path in out, or -1. Thread: any. */
int spn_models_install_file(const char *file, char *out, size_t outsz);

/* A config's `model` value: an existing file is used as given; otherwise,
 * when its last path component is a model name (a PATH key arrives joined
 * to the config's directory), the name is looked up with spn_models_find.
 * Returns 0 with the file in out, or -1 with msg. Thread: any. */
int spn_models_resolve(const char *value, char *out, size_t outsz, char *msg, size_t msz);

#endif
