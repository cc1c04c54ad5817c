/* fuzz-media.c — libFuzzer target for demux + decode (media-decode.c).
 *
 * Each input is a file handed to spn_decoder_new() (through a memfd, so
 * every demuxer FFmpeg probes sees it as a real file), decoded to RGB frames
 * and float audio until the end, an error, or a budget of items. Rules that
 * abort (so the fuzzer reports them): an error status without a message, a
 * message that does not start with the path, a frame whose size is not the
 * size the decoder announced, audio with a rate or channel count other than
 * announced, or non-finite / decreasing-below-zero timestamps. The decoder
 * sources are compiled into this program with the fuzzer's instrumentation;
 * FFmpeg's own libraries are the system's (not instrumented).
 *
 * Also built (without libFuzzer) as replay-media: runs each file given on
 * the command line once, for the seed corpus in the normal test suite.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "media-decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what) {
  if (!cond) {
    fprintf(stderr, "fuzz-media: rule broken: %s\n", what);
    abort();
  }
}

static void run(const char *path, int32_t pixfmt, int tolerate) {
  spn_decode_opts_t o = SPN_DECODE_OPTS_INIT;
  o.pixfmt = pixfmt;
  o.tolerate_errors = tolerate;
  spn_error_t err = SPN_ERROR_INIT;
  spn_decoder_t *d = NULL;
  int32_t rc = spn_decoder_new(path, &o, &d, &err);
  if (rc != SPN_OK) {
    check(err.msg[0] != '\0', "open error without a message");
    check(strncmp(err.msg, path, strlen(path)) == 0, "open error does not start with the path");
    return;
  }
  const spn_decode_info_t *in = spn_decoder_info(d);
  check(in->has_video && in->width > 0 && in->height > 0, "opened without a sized video stream");
  for (int n = 0; n < 64; n++) {
    spn_media_item_t it;
    spn_error_t e = SPN_ERROR_INIT;
    rc = spn_decoder_next(d, &it, &e);
    if (rc == SPN_EOS)
      break;
    if (rc != SPN_OK) {
      check(e.msg[0] != '\0', "decode error without a message");
      check(strncmp(e.msg, path, strlen(path)) == 0, "decode error does not start with the path");
      break;
    }
    check(isfinite(it.pts_sec), "non-finite timestamp");
    if (it.kind == SPN_MEDIA_VIDEO) {
      check(it.image.width == in->width && it.image.height == in->height, "frame size differs from the stream's");
      check(it.image.format == pixfmt, "frame format differs from the asked one");
    } else {
      check(it.kind == SPN_MEDIA_AUDIO, "unknown item kind");
      check(it.rate == in->audio_rate && it.channels == in->audio_channels, "audio format differs");
      check(it.n_samples > 0 && it.samples, "empty audio item");
    }
    spn_media_item_release(&it);
  }
  spn_decoder_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz-media", 0);
  if (fd < 0)
    return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  /* the first byte picks the options, so both layouts and both error modes are reached */
  uint8_t sel = size ? data[0] : 0;
  run(path, (sel & 1) ? SPN_PIXFMT_YUV420P : SPN_PIXFMT_RGB24, (sel >> 1) & 1);
  close(fd);
  return 0;
}

#ifdef SPN_FUZZ_REPLAY
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) {
      perror(argv[i]);
      return 1;
    }
    uint8_t *buf = malloc(4 << 20);
    size_t n = buf ? fread(buf, 1, 4 << 20, f) : 0;
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
  }
  printf("replayed %d files\n", argc - 1);
  return 0;
}
#endif
