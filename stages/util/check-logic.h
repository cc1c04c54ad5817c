/* check-logic.h — the stream rules the `check` sink enforces, as pure
 * functions so they are unit-tested without a runtime (tests/runtime).
 *
 * Per job: seqs arrive dense and strictly increasing from 0 (a SKIP message
 * takes a seq but is not a frame); end of stream comes once, after the last
 * frame; the frame count matches the config's expect_frames when set, else
 * the message count matches the envelope's total when one was given. */
#ifndef SPINDLE_STAGES_CHECK_LOGIC_H
#define SPINDLE_STAGES_CHECK_LOGIC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct spn_check_stream {
  uint64_t next_seq; /* the seq the next message must carry */
  int64_t frames;    /* non-SKIP messages seen */
  int64_t total;     /* last envelope total seen (-1 unknown) */
  bool eos;
} spn_check_stream_t;

#define SPN_CHECK_STREAM_INIT {.total = -1}

/* A message arrived. Returns false and writes why into msg on a violation. */
static inline bool spn_check_message(spn_check_stream_t *s, uint64_t seq, bool skip, int64_t total, char *msg,
                                     size_t size) {
  if (s->eos) {
    snprintf(msg, size, "seq %llu arrived after end of stream", (unsigned long long)seq);
    return false;
  }
  if (seq != s->next_seq) {
    snprintf(msg, size, "expected seq %llu, got %llu (%s)", (unsigned long long)s->next_seq,
             (unsigned long long)seq, seq < s->next_seq ? "repeated or out of order" : "gap");
    return false;
  }
  s->next_seq++;
  if (!skip)
    s->frames++;
  if (total >= 0)
    s->total = total;
  return true;
}

/* End of stream. `expect` < 0: use the envelope total if one was seen. */
static inline bool spn_check_eos(spn_check_stream_t *s, int64_t expect, char *msg, size_t size) {
  if (s->eos) {
    snprintf(msg, size, "end of stream twice");
    return false;
  }
  s->eos = true;
  if (expect >= 0 && s->frames != expect) {
    snprintf(msg, size, "end of stream after %lld frames, expected %lld (expect_frames)", (long long)s->frames,
             (long long)expect);
    return false;
  }
  if (expect < 0 && s->total >= 0 && (int64_t)s->next_seq != s->total) {
    snprintf(msg, size, "end of stream after %llu messages, the envelope's total is %lld",
             (unsigned long long)s->next_seq, (long long)s->total);
    return false;
  }
  return true;
}

#endif
