/* zap.c — the CURVE allow-list: a ZAP handler thread that accepts a CURVE
 * connection only when its public key is a file in the clients (or workers)
 * key directory.
 *
 * Invariants:
 * - Only CURVE is accepted; NULL and PLAIN connections are refused.
 * - The reply's user id is the key's role, "worker" (key in workers_dir) or
 *   "client"; the gateway takes worker messages only from "worker"
 *   connections when a workers directory is configured.
 * - The directories are read on every handshake, so adding or removing a key
 *   file takes effect for the next connection without a restart.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "server-internal.h"

/* ---- CURVE allow-list (ZAP) ---- */

static bool key_allowed(const char *dir, const unsigned char *key32) {
  char z85[41];
  if (!zmq_z85_encode(z85, key32, 32))
    return false;
  bool ok = false;
  DIR *d = opendir(dir);
  if (!d)
    return false;
  struct dirent *ent;
  while (!ok && (ent = readdir(d))) {
    if (ent->d_name[0] == '.')
      continue;
    char path[4096], buf[128];
    snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* A key file holds the 40-character Z85 public key, maybe after
     * comment lines starting with '#'. */
    char *line = buf, *save = NULL;
    for (char *tok = strtok_r(line, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
      while (*tok == ' ' || *tok == '\t')
        tok++;
      if (*tok == '#')
        continue;
      if (strlen(tok) >= 40 && !memcmp(tok, z85, 40))
        ok = true;
      break;
    }
  }
  closedir(d);
  return ok;
}

static void *zap_main(void *arg) {
  spn_zap_t *s = arg;
  void *rep = zmq_socket(s->zctx, ZMQ_REP);
  int linger = 0;
  zmq_setsockopt(rep, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(rep, "inproc://zeromq.zap.01") != 0) {
    spn__log_f(s->log, SPN_LOG_ERROR, NULL, "ZAP handler: %s", zmq_strerror(zmq_errno()));
    zmq_close(rep);
    return NULL;
  }
  while (!__atomic_load_n(&s->quit, __ATOMIC_ACQUIRE)) {
    zmq_pollitem_t it = {rep, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 100) <= 0)
      continue;
    zmq_msg_t f[8];
    int n = 0, more = 1;
    while (more) {
      zmq_msg_t tmp;
      zmq_msg_init(&tmp);
      if (zmq_msg_recv(&tmp, rep, 0) < 0) {
        zmq_msg_close(&tmp);
        break;
      }
      more = zmq_msg_more(&tmp);
      if (n < 8)
        f[n++] = tmp;
      else
        zmq_msg_close(&tmp);
    }
    /* ZAP request: version, request id, domain, address, identity,
     * mechanism, credentials... Allow only CURVE with a listed key. The
     * reply's user id is the key's role: "worker" when the key is in
     * curve_workers_dir, else "client"; the gateway accepts worker messages
     * only from "worker" connections when that directory is configured. */
    const char *role = NULL;
    if (n >= 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
        zmq_msg_size(&f[6]) == 32) {
      if (s->workers_dir && key_allowed(s->workers_dir, zmq_msg_data(&f[6])))
        role = "worker";
      else if (key_allowed(s->clients_dir, zmq_msg_data(&f[6])))
        role = "client";
    }
    const char *reqid = n >= 2 ? zmq_msg_data(&f[1]) : "";
    size_t reqid_len = n >= 2 ? zmq_msg_size(&f[1]) : 0;
    zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(rep, reqid, reqid_len, ZMQ_SNDMORE);
    zmq_send(rep, role ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(rep, role ? "OK" : "client key not allowed", role ? 2 : 22, ZMQ_SNDMORE);
    zmq_send(rep, role ? role : "", role ? strlen(role) : 0, ZMQ_SNDMORE);
    zmq_send(rep, "", 0, 0);
    if (!role)
      spn__log_f(s->log, SPN_LOG_WARN, NULL, "refused a CURVE client: key not in %s", s->clients_dir);
    for (int i = 0; i < n; i++)
      zmq_msg_close(&f[i]);
  }
  zmq_close(rep);
  return NULL;
}

int32_t spn__zap_start(spn_zap_t *z, spn_error_t *err) {
  if (pthread_create(&z->th, NULL, zap_main, z) != 0)
    return spn_error_set(err, SPN_EIO, "server: cannot start the ZAP thread");
  z->started = true;
  usleep(20000); /* the handler binds before any CURVE handshake can start */
  return SPN_OK;
}

void spn__zap_stop(spn_zap_t *z) {
  if (!z->started)
    return;
  __atomic_store_n(&z->quit, 1, __ATOMIC_RELEASE);
  pthread_join(z->th, NULL);
  z->started = false;
}
