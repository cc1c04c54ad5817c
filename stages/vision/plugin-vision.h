/* plugin-vision.h — glue shared by the stage kinds of libspindle-vision.so. */
#ifndef SPN_VISION_PLUGIN_VISION_H
#define SPN_VISION_PLUGIN_VISION_H

#include "spindle/plugin.h"

/* The host API table given to init (NULL before). */
const spn_host_api_t *spn__vision_host(void);

/* SPN_OK if `h` has every function the facedetect (or, with superres, the
 * superres) stage calls; otherwise SPN_EUNSUPPORTED with a message. */
int32_t spn__vision_check_host(const spn_host_api_t *h, bool superres, spn_error_t *err);

const spn_stage_kind_t *spn__vision_facedetect_kind(void);
const spn_stage_kind_t *spn__vision_superres_kind(void);

#endif
