/* plugin-vision.c — the descriptor of libspindle-vision.so: registers the
 * facedetect, superres and metasink stage kinds.
 *
 * Stage callbacks reach the host with spn_stage_host(stage) (ABI 1.1); the
 * plugin keeps nothing process-wide. create() still checks that every
 * function it needs is in the table before it relies on them.
 */
#include <stdio.h>

#include "model-path.h"
#include "plugin-vision.h"

static bool can_run_stages(const spn_host_api_t *h) {
  return h->emit && h->msg_find && h->msg_item && h->msg_envelope && h->msg_free && h->fail_job;
}

int32_t vision_check_host(const spn_host_api_t *h, bool superres, spn_error_t *err) {
  if (!h || !can_run_stages(h) || !h->msg_add_meta ||
      (superres && (!h->buffer_new || !h->buffer_data || !h->buffer_unref || !SPN_HOST_HAS(h, msg_clone) ||
                    !SPN_HOST_HAS(h, msg_replace_tensor) || !SPN_HOST_HAS(h, msg_replace_meta))))
    return spn_error_set(err, SPN_EUNSUPPORTED, "vision: this host cannot run stages (API table incomplete)");
  return SPN_OK;
}

int32_t vision_model_path(const spn_host_api_t *h, spn_stage_t *stage, const char *kind, const char *value,
                               bool optional, const char *builtin, char *out, size_t outsz, char *hint,
                               size_t hintsz) {
  const char *name = h->stage_get_name ? h->stage_get_name(stage) : "";
  hint[0] = 0;
  if (spn_models_resolve(value, out, outsz, hint, hintsz) == 0) {
    hint[0] = 0;
    if (h->log)
      h->log(stage, 0, SPN_LOG_INFO, "%s %s: model %s", kind, name, out);
    return 1;
  }
  if (!optional) { /* the host's loader gets the value as written and reports it */
    snprintf(out, outsz, "%s", value);
    return 2;
  }
  /* A warning: the job still succeeds, with a lesser model than the config
   * names (a worker of a farm that lacks the fetched file, say). */
  if (h->log)
    h->log(stage, 0, SPN_LOG_WARN, "%s %s: %s; using %s", kind, name, hint, builtin);
  return 0;
}

static int32_t vision_init(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err) {
  if (!host || host->struct_size < offsetof(spn_host_api_t, reserved) || !host->register_kind)
    return spn_error_set(err, SPN_EABI, "vision: host API table too old");
  int32_t rc = host->register_kind(plugin, vision_facedetect_kind(), err);
  if (rc == SPN_OK)
    rc = host->register_kind(plugin, vision_superres_kind(), err);
  if (rc == SPN_OK)
    rc = host->register_kind(plugin, vision_metasink_kind(), err);
  return rc;
}

SPN_PLUGIN_DEFINE(vision, .version = "0.1.0", .license = "Apache-2.0", .init = vision_init)
