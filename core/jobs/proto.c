/* proto.c — reading and writing job protocol frames (docs/protocol.md).
 *
 * Every rejection rule for an incoming message is here, in the order it is
 * checked: too many frames, missing empty delimiter, wrong magic (version),
 * bad type frame, body not well-formed UTF-8 or a string in it holding a
 * NUL or a control character, body not a JSON object. A refused message still consumes
 * all its frames, so one bad message never desynchronises the socket, and it
 * is reported with an error code the gateway echoes to the sender.
 * Oversize messages never reach us: ZMQ_MAXMSGSIZE makes libzmq drop the
 * connection that sent them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto-internal.h"
#include "spindle/jobs.h"

static void refuse(spn_pmsg_t *m, const char *code, const char *fmt, ...) SPN_PRINTF(3, 4);
static void refuse(spn_pmsg_t *m, const char *code, const char *fmt, ...) {
  if (m->error)
    return; /* keep the first reason */
  m->error = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->detail, sizeof m->detail, fmt, ap);
  va_end(ap);
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!len || len > n)
    return 0;
  for (size_t k = 1; k < len; k++)
    if ((s[k] & 0xC0) != 0x80)
      return 0;
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] > 0x8F))
    return 0; /* overlong, surrogate, or > U+10FFFF */
  return len;
}

/* The strings of a JSON text, checked before cJSON decodes them, because a
 * decoded "\u0000" cuts the C string it becomes: two idempotency keys that
 * differ after it would name one job, an output path would lose its tail.
 * Rules: the whole body is well-formed UTF-8; inside a string no raw byte
 * below 0x20 (JSON forbids them), no \u0000 escape, and no \u escape that
 * is an unpaired surrogate (it cannot become UTF-8). Returns NULL when
 * clean, else the reason, with *at the byte offset. */
static const char *json_strings_check(const char *text, size_t n, size_t *at) {
  const unsigned char *s = (const unsigned char *)text;
  int in_str = 0;
  for (size_t i = 0; i < n;) {
    *at = i;
    size_t l = utf8_len(s + i, n - i);
    if (!l)
      return "invalid UTF-8";
    if (!in_str) {
      in_str = s[i] == '"';
      i += l;
      continue;
    }
    if (s[i] == '"') {
      in_str = 0;
      i++;
    } else if (s[i] < 0x20) {
      return s[i] ? "control character in a string" : "NUL byte in a string";
    } else if (s[i] == '\\' && i + 1 < n && s[i + 1] == 'u') {
      unsigned v = 0;
      for (size_t k = 2; k < 6; k++) {
        int h = i + k < n ? hexval(text[i + k]) : -1;
        if (h < 0)
          return "bad \\u escape";
        v = v * 16 + (unsigned)h;
      }
      if (v == 0)
        return "\\u0000 in a string";
      if (v >= 0xDC00 && v <= 0xDFFF)
        return "unpaired surrogate escape in a string";
      if (v >= 0xD800 && v <= 0xDBFF) {
        /* a high surrogate must be followed by \u and a low one */
        unsigned w = 0;
        if (i + 12 > n || text[i + 6] != '\\' || text[i + 7] != 'u')
          return "unpaired surrogate escape in a string";
        for (size_t k = 8; k < 12; k++) {
          int h = hexval(text[i + k]);
          if (h < 0)
            return "bad \\u escape";
          w = w * 16 + (unsigned)h;
        }
        if (w < 0xDC00 || w > 0xDFFF)
          return "unpaired surrogate escape in a string";
        i += 12;
      } else {
        i += 6;
      }
    } else if (s[i] == '\\') {
      i += 2; /* any other escape is two bytes; cJSON judges which are valid */
    } else {
      i += l;
    }
  }
  return NULL;
}

int32_t spn__proto_recv(void *sock, bool router, spn_pmsg_t *m) {
  zmq_msg_t f[SPN_PROTO_MAX_FRAMES];
  size_t n = 0, total = 0;
  int more = 1;
  memset(m, 0, sizeof *m);
  while (more) {
    zmq_msg_t tmp;
    zmq_msg_init(&tmp);
    if (zmq_msg_recv(&tmp, sock, n == 0 && total == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      int e = zmq_errno();
      zmq_msg_close(&tmp);
      for (size_t i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
      return e == EAGAIN && total == 0 ? SPN_EAGAIN : SPN_EIO;
    }
    more = zmq_msg_more(&tmp);
    total++;
    if (n < SPN_PROTO_MAX_FRAMES)
      f[n++] = tmp; /* zmq_msg_t may be moved by value before reuse */
    else
      zmq_msg_close(&tmp);
  }
  /* The role the ZAP handler gave this connection (CURVE only). */
  const char *uid = n ? zmq_msg_gets(&f[n - 1], "User-Id") : NULL;
  if (uid)
    snprintf(m->user_id, sizeof m->user_id, "%s", uid);
  size_t i = 0;
  if (router) {
    size_t len = zmq_msg_size(&f[0]);
    if (len > SPN_PROTO_IDENT_MAX)
      len = SPN_PROTO_IDENT_MAX;
    memcpy(m->ident, zmq_msg_data(&f[0]), len);
    m->ident_len = len;
    i = 1;
  }
  /* Rule 1: exactly delimiter, magic, type, body. */
  if (total > SPN_PROTO_MAX_FRAMES || n - i != 4) {
    refuse(m, "bad_frame", "expected 4 frames [\"\"][\"SPN1\"][TYPE][JSON], got %zu", total - i);
    goto out;
  }
  /* Rule 2: the empty delimiter frame (REQ-compatible envelope). */
  if (zmq_msg_size(&f[i]) != 0) {
    refuse(m, "bad_frame", "frame 1: expected an empty delimiter frame");
    goto out;
  }
  /* Rule 3: the protocol magic carries the version. */
  if (zmq_msg_size(&f[i + 1]) != 4 || memcmp(zmq_msg_data(&f[i + 1]), "SPN", 3) != 0) {
    refuse(m, "bad_frame", "frame 2: expected protocol magic \"SPN1\"");
    goto out;
  }
  if (memcmp(zmq_msg_data(&f[i + 1]), SPN_PROTO_MAGIC, 4) != 0) {
    refuse(m, "unsupported_version", "frame 2: protocol version \"%.4s\" not supported; this gateway speaks \"SPN1\"",
           (const char *)zmq_msg_data(&f[i + 1]));
    goto out;
  }
  /* Rule 4: a type of 1..16 upper-case letters, digits or '_'. */
  size_t tl = zmq_msg_size(&f[i + 2]);
  const char *t = zmq_msg_data(&f[i + 2]);
  if (tl == 0 || tl > SPN_PROTO_TYPE_MAX) {
    refuse(m, "bad_frame", "frame 3: message type must be 1-%d bytes", SPN_PROTO_TYPE_MAX);
    goto out;
  }
  for (size_t k = 0; k < tl; k++) {
    if (!((t[k] >= 'A' && t[k] <= 'Z') || (t[k] >= '0' && t[k] <= '9') || t[k] == '_')) {
      refuse(m, "bad_frame", "frame 3: byte %zu of the message type is not A-Z, 0-9 or _", k);
      goto out;
    }
  }
  memcpy(m->type, t, tl);
  m->type[tl] = '\0';
  /* Rule 5: the body is UTF-8 and its strings hold no NUL (see above). */
  size_t bl = zmq_msg_size(&f[i + 3]);
  size_t bad_at = 0;
  const char *why = json_strings_check(zmq_msg_data(&f[i + 3]), bl, &bad_at);
  if (why) {
    refuse(m, "bad_json", "%s body: %s at byte %zu", m->type, why, bad_at);
    goto out;
  }
  /* Rule 6: the body is one JSON object. */
  const char *end = NULL;
  m->body = cJSON_ParseWithLengthOpts(zmq_msg_data(&f[i + 3]), bl, &end, 0);
  if (!m->body) {
    size_t at = end ? (size_t)(end - (const char *)zmq_msg_data(&f[i + 3])) : 0;
    refuse(m, "bad_json", "%s body: invalid JSON at byte %zu", m->type, at);
    goto out;
  }
  if (end && (size_t)(end - (const char *)zmq_msg_data(&f[i + 3])) < bl) {
    /* cJSON stops after the value; anything but whitespace after it is junk. */
    for (const char *p = end; p < (const char *)zmq_msg_data(&f[i + 3]) + bl; p++) {
      if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != '\0') {
        refuse(m, "bad_json", "%s body: trailing data at byte %zu", m->type,
               (size_t)(p - (const char *)zmq_msg_data(&f[i + 3])));
        break;
      }
    }
  }
  if (!m->error && !cJSON_IsObject(m->body))
    refuse(m, "bad_json", "%s body: expected a JSON object", m->type);
  if (!m->error) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m->body, "req");
    if (r && cJSON_IsNumber(r))
      m->req = (int64_t)r->valuedouble;
  }
out:
  if (m->error && m->body) {
    cJSON_Delete(m->body);
    m->body = NULL;
  }
  for (size_t k = 0; k < n; k++)
    zmq_msg_close(&f[k]);
  return SPN_OK;
}

static int32_t send_frames(void *sock, const unsigned char *ident, size_t ident_len, const char *type,
                           const cJSON *body, int first_flags) {
  char *js = cJSON_PrintUnformatted(body);
  if (!js)
    return SPN_ENOMEM;
  int rc = 0;
  /* Only the first frame can find no room: ZeroMQ queues a message's
   * later frames wherever its first one went. */
  if (ident)
    rc = zmq_send(sock, ident, ident_len, ZMQ_SNDMORE | first_flags);
  if (rc >= 0)
    rc = zmq_send(sock, "", 0, ZMQ_SNDMORE | (ident ? 0 : first_flags));
  if (rc >= 0)
    rc = zmq_send(sock, SPN_PROTO_MAGIC, 4, ZMQ_SNDMORE);
  if (rc >= 0)
    rc = zmq_send(sock, type, strlen(type), ZMQ_SNDMORE);
  if (rc >= 0)
    rc = zmq_send(sock, js, strlen(js), 0);
  free(js);
  return rc < 0 ? (zmq_errno() == EAGAIN ? SPN_EAGAIN : SPN_EIO) : SPN_OK;
}

int32_t spn__proto_send(void *sock, const unsigned char *ident, size_t ident_len, const char *type,
                        const cJSON *body) {
  return send_frames(sock, ident, ident_len, type, body, 0);
}

int32_t spn__proto_send_nowait(void *sock, const char *type, const cJSON *body) {
  return send_frames(sock, NULL, 0, type, body, ZMQ_DONTWAIT);
}

int32_t spn__proto_send_error(void *sock, const unsigned char *ident, size_t ident_len, int64_t req,
                              const char *code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cJSON *b = cJSON_CreateObject();
  if (!b)
    return SPN_ENOMEM;
  if (req)
    cJSON_AddNumberToObject(b, "req", (double)req);
  cJSON_AddStringToObject(b, "code", code);
  cJSON_AddStringToObject(b, "message", msg);
  int32_t rc = spn__proto_send(sock, ident, ident_len, "ERROR", b);
  cJSON_Delete(b);
  return rc;
}

const char *spn__json_str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

bool spn__json_int(const cJSON *o, const char *key, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v))
    return false;
  double d = v->valuedouble;
  if (d != (double)(int64_t)d || d > 9007199254740992.0 || d < -9007199254740992.0)
    return false;
  *out = (int64_t)d;
  return true;
}

int32_t spn__proto_socket_setup(void *sock, uint32_t max_msg, spn_error_t *err) {
  int64_t mx = max_msg ? (int64_t)max_msg : SPN_PROTO_DEFAULT_MAX_MSG;
  int linger = 0;
  if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &mx, sizeof mx) != 0 ||
      zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger) != 0)
    return spn_error_set(err, SPN_EIO, "zmq socket options: %s", zmq_strerror(zmq_errno()));
  return SPN_OK;
}

static const char *const state_names[SPN_QSTATE_COUNT] = {
    "queued", "running", "succeeded", "failed", "cancelled", "dead"};

const char *spn_queue_state_name(spn_queue_state_t s) {
  return (unsigned)s < SPN_QSTATE_COUNT ? state_names[s] : NULL;
}

int32_t spn_queue_state_parse(const char *name) {
  for (int i = 0; i < SPN_QSTATE_COUNT; i++)
    if (name && !strcmp(name, state_names[i]))
      return i;
  return -1;
}

int64_t spn__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void spn__say_duration(double seconds, char *out, size_t n) {
  if (seconds < 120)
    snprintf(out, n, "%.0f s", seconds);
  else if (seconds < 7200)
    snprintf(out, n, "%.0f min", seconds / 60);
  else
    snprintf(out, n, "%.0f h", seconds / 3600);
}

double spn__mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

