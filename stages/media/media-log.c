/* media-log.c — FFmpeg's av_log routed to Spindle's logger (media-log.h).
 *
 * Invariant: the callback reads only the context it is given and what that
 * context points to; it allocates nothing and keeps nothing between calls,
 * so it is safe from FFmpeg's frame and slice threads. A line FFmpeg writes
 * in several calls arrives as several messages (rare: FFmpeg's own code
 * writes whole lines almost everywhere).
 */
#include "media-log.h"

#include <stdio.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/log.h>

#include "spindle/plugin.h"

/* The owner of a logging context: walk parents (a muxer's private context,
 * a codec's private class) up to an AVFormatContext or AVCodecContext. */
static const spn_media_log_t *owner(void *avcl) {
  for (int depth = 0; avcl && depth < 8; depth++) {
    const AVClass *c = *(const AVClass **)avcl;
    if (!c || !c->class_name)
      return NULL;
    const spn_media_log_t *l;
    if (!strcmp(c->class_name, "AVFormatContext"))
      l = ((AVFormatContext *)avcl)->opaque;
    else if (!strcmp(c->class_name, "AVCodecContext"))
      l = ((AVCodecContext *)avcl)->opaque;
    else if (c->parent_log_context_offset) {
      avcl = *(void **)((char *)avcl + c->parent_log_context_offset);
      continue;
    } else
      return NULL;
    return l && l->magic == SPN_MEDIA_LOG_MAGIC ? l : NULL;
  }
  return NULL;
}

static void callback(void *avcl, int level, const char *fmt, va_list vl) {
  if (level > AV_LOG_VERBOSE || !avcl)
    return; /* debug/trace: never formatted */
  const spn_media_log_t *l = owner(avcl);
  if (!l || !l->fn)
    return;
  int32_t lv = level <= AV_LOG_ERROR ? SPN_LOG_WARN : level <= AV_LOG_WARNING ? SPN_LOG_INFO : SPN_LOG_DEBUG;
  char line[1024];
  const AVClass *c = *(const AVClass **)avcl;
  const char *name = c->item_name ? c->item_name(avcl) : c->class_name;
  int n = snprintf(line, sizeof line, "%s: ", name ? name : "ffmpeg");
  if (n < 0 || (size_t)n >= sizeof line)
    n = 0;
  va_list ap;
  va_copy(ap, vl);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  while (len > (size_t)n && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
    line[--len] = '\0';
  /* An empty piece, or the tail of a line FFmpeg wrote in two calls
   * ("Packet corrupt (...)" then "."): nothing to read in it. */
  int words = 0;
  for (size_t k = (size_t)n; k < len && !words; k++)
    words = (line[k] >= 'a' && line[k] <= 'z') || (line[k] >= 'A' && line[k] <= 'Z') || (line[k] >= '0' && line[k] <= '9');
  if (!words)
    return;
  l->fn(l->user, lv, line);
}

/* Setting the same function again is harmless, so no "installed" flag of
 * our own is kept. */
void spn_media_log_install(void) { av_log_set_callback(callback); }

void spn_media_log_claim_format(void *fmt_ctx, const spn_media_log_t *log) {
  if (fmt_ctx && log)
    ((AVFormatContext *)fmt_ctx)->opaque = (void *)log;
}

void spn_media_log_claim_codec(void *codec_ctx, const spn_media_log_t *log) {
  if (codec_ctx && log)
    ((AVCodecContext *)codec_ctx)->opaque = (void *)log;
}
