/* media-log.h — FFmpeg's log messages routed to the owner of the context
 * that wrote them.
 *
 * FFmpeg has one log callback per process (av_log_set_callback); that is
 * the only global this module sets, always to the same function.
 * The callback itself keeps no state: it walks from the logging context up
 * to the AVFormatContext or AVCodecContext that owns it and reads that
 * context's `opaque`, which the decoder or encoder pointed at its
 * spn_media_log_t. So two jobs (two decoders, in one process or one
 * pipeline) log each with its own stage and job. Messages from a context
 * nobody claimed (FFmpeg's parsers inside stream probing, swscale) are
 * dropped; the operation that failed reports its own error.
 *
 * Levels: FFmpeg's error (and fatal, panic) -> warn, because the job's own
 * error says what failed and FFmpeg's line is the detail; warning -> info;
 * info and verbose (x264's and the AAC encoder's statistics, the muxer's
 * "second pass") -> debug; debug and trace are never formatted.
 */
#ifndef SPN_MEDIA_LOG_H
#define SPN_MEDIA_LOG_H

#include <stdint.h>

/* level: SPN_LOG_DEBUG..SPN_LOG_ERROR (spindle/plugin.h values); msg has
 * no trailing newline and starts with the FFmpeg component ("libx264: "). */
typedef void (*spn_media_log_fn)(void *user, int32_t level, const char *msg);

typedef struct spn_media_log {
  uint32_t magic;          /* SPN_MEDIA_LOG_MAGIC: guards against another user of `opaque` */
  spn_media_log_fn fn;
  void *user;
} spn_media_log_t;

#define SPN_MEDIA_LOG_MAGIC 0x53504c47u /* "SPLG" */

/* Install the callback (idempotent). Thread: the plugin's init. */
void spn_media_log_install(void);

/* Point an AVFormatContext's / AVCodecContext's opaque at log (borrowed; it
 * must outlive the context). NULL log: leave the context unclaimed. */
void spn_media_log_claim_format(void *fmt_ctx, const spn_media_log_t *log);
void spn_media_log_claim_codec(void *codec_ctx, const spn_media_log_t *log);

#endif
