/* test-wav.c — the melspec stage's WAV reader and resampler
 * (stages/lipsync/wav.c).
 *
 * WAV files are built here byte by byte (integer PCM of each width, float,
 * extensible, stereo, odd-sized chunks to skip, streamed data sizes), and
 * the samples are checked against the values written. Every prefix of a
 * valid file and a set of corrupted headers must fail with a message naming
 * the file, never crash. The resampler is checked on tones against the
 * analytic signal at the new rate, and on a tone above the new Nyquist
 * frequency, which must be filtered out.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wav.h"

typedef struct wbuf {
  uint8_t d[1 << 16];
  size_t n;
} wbuf_t;

static void put(wbuf_t *b, const void *p, size_t n) {
  assert_true(b->n + n <= sizeof b->d);
  memcpy(b->d + b->n, p, n);
  b->n += n;
}
static void put16(wbuf_t *b, uint32_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  put(b, x, 2);
}
static void put32(wbuf_t *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(b, x, 4);
}

/* A WAV header with fmt (plain or extensible), an odd "LIST" chunk to skip,
 * and a data chunk header claiming `data_size` bytes (the data follows). */
static void header(wbuf_t *b, uint16_t tag, uint16_t ch, uint32_t rate, uint16_t bits, uint32_t data_size,
                   int extensible) {
  b->n = 0;
  put(b, "RIFF", 4);
  put32(b, 0); /* readers ignore the RIFF size; so do we */
  put(b, "WAVE", 4);
  put(b, "LIST", 4);
  put32(b, 3);
  put(b, "abc\0", 4); /* 3 bytes + pad */
  put(b, "fmt ", 4);
  put32(b, extensible ? 40 : 16);
  put16(b, extensible ? 0xFFFE : tag);
  put16(b, ch);
  put32(b, rate);
  put32(b, rate * ch * bits / 8);
  put16(b, (uint16_t)(ch * bits / 8));
  put16(b, bits);
  if (extensible) {
    put16(b, 22);
    put16(b, bits);
    put32(b, 3); /* channel mask */
    put16(b, tag);
    put(b, "\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71", 14);
  }
  put(b, "data", 4);
  put32(b, data_size);
}

static void test_pcm16_stereo(void **ctx) {
  (void)ctx;
  static wbuf_t b;
  const int16_t L[4] = {0, 16384, -32768, 32767}, R[4] = {100, -16384, -32768, 1};
  header(&b, 1, 2, 8000, 16, 16, 0);
  for (int i = 0; i < 4; i++)
    put16(&b, (uint16_t)L[i]), put16(&b, (uint16_t)R[i]);
  spn_wav_t w;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_wav_parse(b.d, b.n, "t.wav", &w, &err), SPN_OK);
  assert_int_equal(w.sample_rate, 8000);
  assert_int_equal(w.channels, 2);
  assert_int_equal(w.n, 4);
  for (int i = 0; i < 4; i++)
    assert_float_equal(w.samples[i], ((double)L[i] + R[i]) / 2 / 32768.0, 1e-7);
  spn_wav_release(&w);
  assert_null(w.samples);
}

static void test_formats(void **ctx) {
  (void)ctx;
  static wbuf_t b;
  spn_wav_t w;
  spn_error_t err = SPN_ERROR_INIT;
  /* 8-bit unsigned */
  header(&b, 1, 1, 16000, 8, 3, 0);
  put(&b, "\x00\x80\xff", 3);
  put(&b, "\x00", 1); /* pad byte after the odd data chunk */
  assert_int_equal(spn_wav_parse(b.d, b.n, "u8.wav", &w, &err), SPN_OK);
  assert_int_equal(w.n, 3);
  assert_float_equal(w.samples[0], -1.0, 0);
  assert_float_equal(w.samples[1], 0.0, 0);
  assert_float_equal(w.samples[2], 127 / 128.0, 1e-7);
  spn_wav_release(&w);
  /* 24-bit, extensible */
  header(&b, 1, 1, 16000, 24, 6, 1);
  put(&b, "\x00\x00\x80\xff\xff\x7f", 6); /* -2^23, 2^23 - 1 */
  assert_int_equal(spn_wav_parse(b.d, b.n, "s24.wav", &w, &err), SPN_OK);
  assert_int_equal(w.n, 2);
  assert_float_equal(w.samples[0], -1.0, 0);
  assert_float_equal(w.samples[1], 8388607 / 8388608.0, 1e-7);
  spn_wav_release(&w);
  /* 32-bit integer */
  header(&b, 1, 1, 16000, 32, 4, 0);
  put32(&b, 0xC0000000u); /* -2^30 */
  assert_int_equal(spn_wav_parse(b.d, b.n, "s32.wav", &w, &err), SPN_OK);
  assert_float_equal(w.samples[0], -0.5, 0);
  spn_wav_release(&w);
  /* float 32 and 64, extensible float */
  float f[2] = {0.25f, -0.75f};
  header(&b, 3, 2, 22050, 32, 8, 0);
  put(&b, f, 8);
  assert_int_equal(spn_wav_parse(b.d, b.n, "f32.wav", &w, &err), SPN_OK);
  assert_int_equal(w.n, 1);
  assert_float_equal(w.samples[0], -0.25, 0);
  spn_wav_release(&w);
  double g = 0.125;
  header(&b, 3, 1, 16000, 64, 8, 1);
  put(&b, &g, 8);
  assert_int_equal(spn_wav_parse(b.d, b.n, "f64.wav", &w, &err), SPN_OK);
  assert_float_equal(w.samples[0], 0.125, 0);
  spn_wav_release(&w);
  /* Streamed: the data size says 0xFFFFFFFF; read to the end (whole frames). */
  header(&b, 1, 1, 16000, 16, 0xFFFFFFFFu, 0);
  put16(&b, 0x4000), put16(&b, 0x2000), put(&b, "\x01", 1);
  assert_int_equal(spn_wav_parse(b.d, b.n, "stream.wav", &w, &err), SPN_OK);
  assert_int_equal(w.n, 2);
  assert_float_equal(w.samples[1], 0.25, 0);
  spn_wav_release(&w);
}

static void test_bad_files(void **ctx) {
  (void)ctx;
  static wbuf_t b;
  spn_wav_t w;
  spn_error_t err = SPN_ERROR_INIT;
  header(&b, 1, 1, 16000, 16, 4, 0);
  put16(&b, 1), put16(&b, 2);
  /* Every prefix: either an error naming the file or (once the fmt and
   * data headers are there) a shorter read. Never a crash or a read past. */
  for (size_t n = 0; n < b.n; n++) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, b.d, n);
    int32_t rc = spn_wav_parse(copy, n, "cut.wav", &w, &err);
    if (rc == SPN_OK) {
      assert_true(w.n <= 1);
      spn_wav_release(&w);
    } else {
      assert_non_null(strstr(err.msg, "cut.wav"));
    }
    free(copy);
  }
  struct {
    size_t off;
    uint32_t v;
    int width;
    const char *want;
  } cases[] = {
      /* offsets in header()'s layout: RIFF 0, LIST 12 (size at 16), fmt 24
       * (size 28, tag 32, channels 34, rate 36, align 44, bits 46), data 48 */
      {0, 0x46464952u ^ 1, 4, "not a RIFF/WAVE"},
      {28, 8, 4, "fmt chunk of 8 bytes"},
      {32, 2, 2, "format tag 2"}, /* ADPCM */
      {34, 0, 2, "0 channels"},
      {36, 0, 4, "sample rate 0"},
      {44, 3, 2, "block align 3"},
      {46, 12, 2, "12 bits"},
      {16, 0x7FFFFFF0u, 4, "runs past the end"}, /* the LIST chunk's size */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    static wbuf_t c;
    header(&c, 1, 1, 16000, 16, 4, 0);
    put16(&c, 1), put16(&c, 2);
    size_t off = cases[i].off;
    for (int k = 0; k < cases[i].width; k++)
      c.d[off + (size_t)k] = (uint8_t)(cases[i].v >> (8 * k));
    assert_int_not_equal(spn_wav_parse(c.d, c.n, "bad.wav", &w, &err), SPN_OK);
    if (!strstr(err.msg, cases[i].want) || !strstr(err.msg, "bad.wav"))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].want);
    assert_null(w.samples);
  }
  /* No data chunk; a missing file. */
  header(&b, 1, 1, 16000, 16, 4, 0);
  memcpy(b.d + b.n - 8, "junk", 4);
  assert_int_not_equal(spn_wav_parse(b.d, b.n, "nodata.wav", &w, &err), SPN_OK);
  assert_int_equal(spn_wav_read("/nonexistent/dir/x.wav", &w, &err), SPN_ENOENT);
  assert_non_null(strstr(err.msg, "/nonexistent/dir/x.wav"));
}

static double tone_error(int32_t in_rate, int32_t out_rate, double hz, double *rms_out) {
  int64_t n = in_rate; /* one second */
  float *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(0.5 * sin(2 * M_PI * hz * (double)i / in_rate));
  float *y = NULL;
  int64_t m = 0;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_audio_resample(x, n, in_rate, out_rate, &y, &m, &err), SPN_OK);
  assert_int_equal(m, out_rate);
  double maxe = 0, ss = 0;
  int64_t cnt = 0;
  for (int64_t j = m / 10; j < m - m / 10; j++) { /* away from the zero-padded ends */
    double want = 0.5 * sin(2 * M_PI * hz * (double)j / out_rate);
    maxe = fmax(maxe, fabs(y[j] - want));
    ss += (double)y[j] * y[j];
    cnt++;
  }
  if (rms_out)
    *rms_out = sqrt(ss / (double)cnt);
  free(x);
  free(y);
  return maxe;
}

static void test_resample(void **ctx) {
  (void)ctx;
  assert_true(tone_error(48000, 16000, 1000.0, NULL) < 2e-3);
  assert_true(tone_error(44100, 16000, 440.0, NULL) < 2e-3);
  assert_true(tone_error(8000, 16000, 300.0, NULL) < 2e-3);
  assert_true(tone_error(16000, 16000, 300.0, NULL) < 1e-7); /* a copy */
  double rms = 0;
  (void)tone_error(48000, 16000, 12000.0, &rms); /* above 8 kHz: filtered out */
  assert_true(rms < 5e-3);
  float *y = NULL;
  int64_t m = 0;
  spn_error_t err = SPN_ERROR_INIT;
  assert_int_equal(spn_audio_resample(NULL, 0, 48000, 16000, &y, &m, &err), SPN_OK);
  assert_int_equal(m, 0);
  free(y);
  assert_int_equal(spn_audio_resample(NULL, 10, 0, 16000, &y, &m, &err), SPN_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pcm16_stereo),
      cmocka_unit_test(test_formats),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_resample),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
