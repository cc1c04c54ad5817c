/* haar-internal.h — the in-memory cascade shared by the loader and the detector. */
#ifndef SPN_VISION_HAAR_INTERNAL_H
#define SPN_VISION_HAAR_INTERNAL_H

#include "haar.h"

#define SPN__HAAR_MAX_RECTS 3

typedef struct haar_feature {
  struct {
    int32_t x, y, w, h;
    float weight;
  } r[SPN__HAAR_MAX_RECTS];
  int32_t nrects;
  int32_t tilted;
} haar_feature_t;

/* left/right > 0: node index within the tree; <= 0: leaf -left/-right. */
typedef struct haar_node {
  int32_t left, right, feature;
  float threshold;
} haar_node_t;

typedef struct haar_tree {
  int32_t node_count, first_node, first_leaf;
} haar_tree_t;

typedef struct haar_stage {
  int32_t first_tree, ntrees;
  float threshold; /* file value minus 1e-5 */
} haar_stage_t;

typedef struct haar_stump {
  int32_t feature;
  float threshold, left, right;
} haar_stump_t;

struct spn_haar_cascade {
  int32_t win_w, win_h;
  int32_t nstages, ntrees, nnodes, nleaves, nfeatures;
  haar_stage_t *stages;
  haar_tree_t *trees;
  haar_node_t *nodes;
  float *leaves;
  haar_feature_t *features;
  haar_stump_t *stumps; /* non-NULL when every tree is a single node */
  int32_t max_nodes;
  int32_t has_tilted;
};

#endif
