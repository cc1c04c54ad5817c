/* submit.c — submit one job to a Spindle gateway and follow it to the end,
 * using only the installed client library.
 *
 *   cc submit.c $(pkg-config --cflags --libs spindle-client) -o submit
 *   ./submit tcp://127.0.0.1:7700 copy in=/data/in.bin out=/data/out.bin
 *
 * Exits 0 when the job succeeds, 1 otherwise. It follows the job across a
 * gateway restart, and gives up after 10 minutes without an answer.
 */
#include <stdio.h>
#include <string.h>

#include <spindle/client.h>

/* While the gateway does not answer (a restart; the job is in its queue
 * and goes on), the watch calls back with the last status again: say so
 * once, and give up after 10 minutes. */
#define GATEWAY_WAIT_MS 600000

static int on_event(void *user, const spn_client_status_t *ev) {
  static int silent; /* a sample: one watch at a time */
  spn_client_t *client = user;
  int64_t unanswered = spn_client_unanswered_ms(client);
  if (unanswered > 0) {
    if (!silent)
      printf("job %lld: no answer from the gateway for %lld s; still trying\n", (long long)ev->id,
             (long long)(unanswered / 1000));
    silent = 1;
    return unanswered >= GATEWAY_WAIT_MS; /* non-zero: stop watching */
  }
  if (silent)
    printf("job %lld: the gateway answers again\n", (long long)ev->id);
  silent = 0;
  char why[512];
  if (spn_client_waiting(client, ev->id, why, sizeof why)) /* no worker runs its pipeline yet */
    printf("job %lld waiting: %s\n", (long long)ev->id, why);
  else if (ev->total)
    printf("job %lld %s %llu/%llu\n", (long long)ev->id, spn_queue_state_name(ev->state),
           (unsigned long long)ev->done, (unsigned long long)ev->total);
  else
    printf("job %lld %s\n", (long long)ev->id, spn_queue_state_name(ev->state));
  return 0; /* keep watching */
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ENDPOINT PIPELINE [in=PATH]... [out=PATH]...\n", argv[0]);
    return 2;
  }
  spn_error_t err = SPN_ERROR_INIT;
  spn_client_t *client = NULL;
  spn_client_job_t *job = NULL;
  int rc = 1;
  if (spn_client_new(argv[1], NULL, &client, &err) < 0)
    goto out;
  job = spn_client_job_new(argv[2]);
  if (!job)
    goto out;
  for (int i = 3; i < argc; i++) {
    /* "in=PATH" is input "in", "out=PATH" output "out" */
    const char *eq = strchr(argv[i], '=');
    if (!eq) {
      fprintf(stderr, "expected NAME=PATH, got %s\n", argv[i]);
      goto out;
    }
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq - argv[i]), argv[i]);
    if (!strncmp(name, "out", 3))
      spn_client_job_output(job, name, eq + 1);
    else
      spn_client_job_input(job, name, eq + 1);
  }
  int64_t id;
  if (spn_client_submit(client, job, &id, NULL, &err) < 0)
    goto out;
  printf("submitted job %lld\n", (long long)id);
  spn_client_status_t final;
  if (spn_client_watch(client, id, on_event, client, &final, &err) < 0)
    goto out;
  if (!spn_queue_state_terminal(final.state)) { /* on_event gave up on a silent gateway */
    fprintf(stderr, "submit: job %lld: gave up after %d s without an answer from the gateway; it was %s and "
            "stays in its queue\n", (long long)id, GATEWAY_WAIT_MS / 1000, spn_queue_state_name(final.state));
    goto out;
  }
  printf("job %lld finished: %s%s%s (%.3f s of compute)\n", (long long)id,
         spn_queue_state_name(final.state), final.reason[0] ? ": " : "", final.reason,
         final.compute_s);
  rc = final.state == SPN_QSTATE_SUCCEEDED ? 0 : 1;
out:
  if (err.code)
    fprintf(stderr, "submit: %s\n", err.msg);
  spn_client_job_free(&job);
  spn_client_free(&client);
  return rc;
}
