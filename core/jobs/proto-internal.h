/* proto-internal.h — framing of the Spindle job protocol (docs/protocol.md)
 * shared by the gateway, the remote worker and the client library.
 *
 * A message on the wire, as a DEALER sends it:
 *   [""] ["SPN1"] [TYPE] [JSON body]
 * and as the ROUTER sees it, with the peer's routing id in front:
 *   [identity] [""] ["SPN1"] [TYPE] [JSON body]
 */
#ifndef SPINDLE_PROTO_INTERNAL_H
#define SPINDLE_PROTO_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spindle/status.h"

#define SPN_PROTO_MAGIC "SPN1"
#define SPN_PROTO_VERSION 1
#define SPN_PROTO_MAX_FRAMES 8
#define SPN_PROTO_TYPE_MAX 16
#define SPN_PROTO_DEFAULT_MAX_MSG (1 << 20)
#define SPN_PROTO_IDENT_MAX 255

/* One received message. `ident` is set only on ROUTER sockets. */
typedef struct spn_pmsg {
  unsigned char ident[SPN_PROTO_IDENT_MAX];
  size_t ident_len;
  char type[SPN_PROTO_TYPE_MAX + 1];
  cJSON *body;      /* parsed object, or NULL when the message was refused */
  const char *error; /* protocol error code when refused ("bad_frame", ...) */
  char detail[256];  /* what was wrong, for the error reply */
  int64_t req;       /* the body's "req" (echoed in replies), 0 if none */
  char user_id[16];  /* ZAP user id of the connection (CURVE role), "" if none */
} spn_pmsg_t;

/* Receive one whole message (all its frames) without blocking. Returns
 * SPN_OK with *m filled (m->error set if malformed; the body is then NULL),
 * SPN_EAGAIN when nothing is waiting, or SPN_EIO. Caller frees m->body. */
int32_t spn__proto_recv(void *sock, bool router, spn_pmsg_t *m);
/* Send [ident]["" ]["SPN1"][type][json]. ident NULL on DEALER sockets.
 * On a ROUTER it never blocks (a full or unknown peer drops the message).
 * On a DEALER it waits for a peer that can take the message (none while a
 * connection is refused or its queue is full), up to ZMQ_SNDTIMEO; see
 * spn__proto_send_nowait. Ownership: body borrowed. */
int32_t spn__proto_send(void *sock, const unsigned char *ident, size_t ident_len, const char *type,
                        const cJSON *body);
/* spn__proto_send that never waits: SPN_EAGAIN, nothing sent, when no peer
 * can take the message now (the frames of a message go all or none). */
int32_t spn__proto_send_nowait(void *sock, const char *type, const cJSON *body);
/* Send ERROR {req, code, message}. */
int32_t spn__proto_send_error(void *sock, const unsigned char *ident, size_t ident_len, int64_t req,
                              const char *code, const char *fmt, ...) SPN_PRINTF(6, 7);

/* Body helpers: typed lookups that do not crash on absent or mistyped keys. */
const char *spn__json_str(const cJSON *o, const char *key);
bool spn__json_int(const cJSON *o, const char *key, int64_t *out);
/* Set the socket options every Spindle socket gets (max message size,
 * linger, no blocking sends on unroutable ids). */
int32_t spn__proto_socket_setup(void *sock, uint32_t max_msg, spn_error_t *err);

#endif
