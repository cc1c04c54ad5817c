/* facedet-driver.c — command-line access to stages/vision/facedet for
 * test-facedet-decode.py.
 *
 *   facedet-driver decode MODEL IMG_W IMG_H IN_W IN_H FIT SCORE NMS PRE_K POST_K FILE:D0xD1[xD2]...
 *       reads raw float32 outputs, prints {"geom": ..., "faces": [[x0,y0,x1,y1,score,l0..l9], ...]}
 *       or {"error": code, "msg": ...} (exit 3) when decoding fails.
 *   facedet-driver pre MODEL BGR IMG_W IMG_H IN_W IN_H FIT IMAGE.raw OUT.f32
 *       interleaved 8-bit 3-channel image in, (1,3,IN_H,IN_W) float32 out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "facedet.h"

static int model_of(const char *s) {
  if (!strcmp(s, "retinaface"))
    return SPN_FACEDET_RETINAFACE;
  if (!strcmp(s, "scrfd"))
    return SPN_FACEDET_SCRFD;
  if (!strcmp(s, "yunet"))
    return SPN_FACEDET_YUNET;
  return 0;
}

static void *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  void *buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

int main(int argc, char **argv) {
  spn_error_t err = SPN_ERROR_INIT;
  spn_facedet_geom_t g;
  if (argc >= 11 && !strcmp(argv[1], "pre")) {
    int model = model_of(argv[2]), bgr = atoi(argv[3]);
    int iw = atoi(argv[4]), ih = atoi(argv[5]);
    if (spn_facedet_fit(iw, ih, atoi(argv[6]), atoi(argv[7]), atoi(argv[8]), &g, &err) != SPN_OK) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    size_t len;
    uint8_t *img = read_all(argv[9], &len);
    if (!img || len != (size_t)iw * ih * 3) {
      fprintf(stderr, "%s: expected %d bytes\n", argv[9], iw * ih * 3);
      return 1;
    }
    size_t n = (size_t)g.in_w * g.in_h * 3;
    float *out = malloc(n * sizeof *out);
    if (spn_facedet_preprocess(model, img, iw * 3, bgr, &g, out, &err) != SPN_OK) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    FILE *f = fopen(argv[10], "wb");
    fwrite(out, sizeof *out, n, f);
    fclose(f);
    printf("{\"in_w\": %d, \"in_h\": %d, \"resized_w\": %d, \"resized_h\": %d, \"scale_x\": %.9g, \"scale_y\": %.9g}\n",
           g.in_w, g.in_h, g.resized_w, g.resized_h, g.scale_x, g.scale_y);
    free(out);
    free(img);
    return 0;
  }
  if (argc < 13 || strcmp(argv[1], "decode")) {
    fprintf(stderr, "usage: see the header of facedet-driver.c\n");
    return 2;
  }
  int model = model_of(argv[2]);
  if (spn_facedet_fit(atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), &g, &err) !=
      SPN_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  spn_facedet_params_t p = SPN_FACEDET_PARAMS_INIT;
  p.score_threshold = (float)atof(argv[8]);
  p.nms_threshold = (float)atof(argv[9]);
  p.pre_nms_top_k = atoi(argv[10]);
  p.post_nms_top_k = atoi(argv[11]);
  int no = argc - 12;
  spn_tensor_t *outs = calloc((size_t)no, sizeof *outs);
  for (int i = 0; i < no; i++) {
    char *spec = strdup(argv[12 + i]);
    char *colon = strrchr(spec, ':');
    if (!colon) {
      fprintf(stderr, "bad output spec %s\n", argv[12 + i]);
      return 2;
    }
    *colon = '\0';
    outs[i] = (spn_tensor_t)SPN_TENSOR_INIT;
    outs[i].dtype = SPN_DTYPE_F32;
    char *dims = colon + 1, *tok, *save = NULL;
    for (tok = strtok_r(dims, "x", &save); tok && outs[i].ndim < SPN_TENSOR_MAX_DIMS; tok = strtok_r(NULL, "x", &save))
      outs[i].shape[outs[i].ndim++] = atoll(tok);
    size_t len;
    outs[i].data = read_all(spec, &len);
    if (!outs[i].data || len != spn_tensor_nbytes(&outs[i])) {
      fprintf(stderr, "%s: size %zu does not match its shape\n", spec, len);
      return 2;
    }
    free(spec);
  }
  spn_detface_t *faces = NULL;
  int32_t n = 0;
  int32_t rc = spn_facedet_decode(model, outs, no, &g, &p, &faces, &n, &err);
  if (rc != SPN_OK) {
    printf("{\"error\": %d, \"msg\": \"%s\"}\n", rc, err.msg);
  } else {
    printf("{\"faces\": [");
    for (int32_t i = 0; i < n; i++) {
      spn_detface_t *f = &faces[i];
      printf("%s[%.9g, %.9g, %.9g, %.9g, %.9g", i ? ", " : "", f->x0, f->y0, f->x1, f->y1, f->score);
      if (f->has_landmarks)
        for (int k = 0; k < 10; k++)
          printf(", %.9g", f->landmarks[k]);
      printf("]");
    }
    printf("]}\n");
  }
  for (int i = 0; i < no; i++)
    free(outs[i].data);
  free(outs);
  free(faces);
  return rc == SPN_OK ? 0 : 3;
}
