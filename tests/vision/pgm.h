/* pgm.h — a minimal binary PGM (P5, 8-bit) reader for the vision test drivers. */
#ifndef SPN_TEST_PGM_H
#define SPN_TEST_PGM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Returns a malloc'd w*h buffer or NULL. */
static inline uint8_t *pgm_read(const char *path, int32_t *w, int32_t *h) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char magic[3] = {0};
  int maxv = 0;
  uint8_t *buf = NULL;
  if (fscanf(f, "%2s %d %d %d", magic, w, h, &maxv) != 4 || magic[0] != 'P' || magic[1] != '5' || maxv != 255 ||
      *w <= 0 || *h <= 0 || *w > 16384 || *h > 16384 || fgetc(f) == EOF)
    goto out;
  buf = malloc((size_t)*w * (size_t)*h);
  if (buf && fread(buf, 1, (size_t)*w * (size_t)*h, f) != (size_t)*w * (size_t)*h) {
    free(buf);
    buf = NULL;
  }
out:
  fclose(f);
  return buf;
}

#endif
