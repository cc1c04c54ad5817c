/* plugin-vision.c — the descriptor of libspindle-vision.so: registers the
 * facedetect and superres stage kinds.
 *
 * plugin.h hands the host API table to init() only, while create() has no
 * way to reach it, so it is kept in one static pointer: written once by
 * init, never changed afterwards, and a second init from a different table
 * is refused. It is the table of the one host that loaded this object, not
 * pipeline state: two pipelines in that host share nothing through it.
 */
#include "plugin-vision.h"

static const spn_host_api_t *g_host;

const spn_host_api_t *spn__vision_host(void) {
  return g_host;
}

static int32_t vision_init(const spn_host_api_t *host, spn_plugin_t *plugin, spn_error_t *err) {
  if (!host || host->struct_size < offsetof(spn_host_api_t, reserved) || !host->register_kind)
    return spn_error_set(err, SPN_EABI, "vision: host API table too old");
  if (g_host && g_host != host)
    return spn_error_set(err, SPN_ESTATE, "vision: already initialised by another host");
  g_host = host;
  int32_t rc = host->register_kind(plugin, spn__vision_facedetect_kind(), err);
  if (rc == SPN_OK)
    rc = host->register_kind(plugin, spn__vision_superres_kind(), err);
  return rc;
}

SPN_PLUGIN_DEFINE(vision, .version = "0.1.0", .license = "Apache-2.0", .init = vision_init)
