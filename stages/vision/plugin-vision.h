/* plugin-vision.h — glue shared by the stage kinds of libspindle-vision.so. */
#ifndef SPN_VISION_PLUGIN_VISION_H
#define SPN_VISION_PLUGIN_VISION_H

#include "spindle/plugin.h"

/* SPN_OK if `h` has every function the facedetect (or, with superres, the
 * superres) stage calls; otherwise SPN_EUNSUPPORTED with a message. */
int32_t vision_check_host(const spn_host_api_t *h, bool superres, spn_error_t *err);

/* A stage's `model` value (a path, or a name from models/manifest.toml that
 * `spindle model fetch` stored) as a file in out. Returns 1 when out holds
 * the model file. When it is not found: with `optional`, one INFO log line
 * says so, how to fetch it and that `builtin` is used, and 0 is returned;
 * otherwise out gets the value as written (the host's loader reports it),
 * hint why the lookup failed, and 2 is returned. Thread: stage (create). */
int32_t vision_model_path(const spn_host_api_t *h, spn_stage_t *stage, const char *kind, const char *value,
                               bool optional, const char *builtin, char *out, size_t outsz, char *hint,
                               size_t hintsz);

const spn_stage_kind_t *vision_facedetect_kind(void);
const spn_stage_kind_t *vision_superres_kind(void);
const spn_stage_kind_t *vision_metasink_kind(void);

#endif
