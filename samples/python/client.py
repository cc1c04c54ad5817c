#!/usr/bin/env python3
"""A Spindle job client in Python (pyzmq), speaking docs/protocol.md.

    python3 client.py --connect tcp://127.0.0.1:7700 submit copy \\
        --input in=/data/in.bin --output out=/data/out.bin --wait
    python3 client.py status 12
    python3 client.py jobs --state running

Exit code with --wait: 0 succeeded, 1 otherwise; 5 when the gateway refused the
request or did not answer (watch and --wait follow a job across a gateway
restart, and give up after --gateway-wait seconds without an answer).
"""
import argparse
import itertools
import json
import os
import sys
import time

import zmq

MAGIC = b"SPN1"
TERMINAL = {"succeeded", "failed", "cancelled", "dead"}


class GatewayError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


class Client:
    def __init__(self, endpoint, timeout_ms=10000, curve=None):
        """curve: optional (server_public, client_public, client_secret) Z85 strings."""
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
        if curve:
            server, public, secret = curve
            self.sock.curve_serverkey = server.encode()
            self.sock.curve_publickey = public.encode()
            self.sock.curve_secretkey = secret.encode()
        self.sock.connect(endpoint)
        self.timeout_ms = timeout_ms
        self.req_ids = itertools.count(1)

    def close(self):
        self.sock.close(0)

    def _send(self, type_, body):
        self.sock.send_multipart([b"", MAGIC, type_.encode(), json.dumps(body).encode()])

    def _recv(self, timeout_ms):
        if not self.sock.poll(timeout_ms):
            raise TimeoutError(f"no answer from the gateway within {timeout_ms} ms")
        frames = self.sock.recv_multipart()
        if len(frames) != 4 or frames[0] != b"" or frames[1] != MAGIC:
            raise GatewayError("bad_frame", f"unexpected reply framing {frames!r}")
        return frames[2].decode(), json.loads(frames[3])

    def call(self, type_, **body):
        """Send a request and return the body of the reply with the same req."""
        req = next(self.req_ids)
        body["req"] = req
        self._send(type_, body)
        while True:
            rtype, rbody = self._recv(self.timeout_ms)
            if rbody.get("req") != req:
                continue  # an event or a late reply
            if rtype == "ERROR":
                raise GatewayError(rbody.get("code"), rbody.get("message"))
            return rbody

    def submit(self, pipeline, inputs=None, outputs=None, params=None, priority=None,
               idempotency_key=None, deadline=None, max_attempts=None, timeout=None):
        body = {"pipeline": pipeline, "inputs": inputs or {}, "outputs": outputs or {},
                "params": params or {}}
        for k, v in (("priority", priority), ("idempotency_key", idempotency_key),
                     ("deadline", deadline), ("max_attempts", max_attempts), ("timeout", timeout)):
            if v is not None:
                body[k] = v
        return self.call("SUBMIT", **body)["id"]

    def status(self, job_id):
        return self.call("STATUS", id=job_id)

    def cancel(self, job_id):
        return self.call("CANCEL", id=job_id)["state"]

    def jobs(self, state=None, limit=100):
        body = {"limit": limit}
        if state:
            body["state"] = state
        return self.call("LIST", **body)["jobs"]

    def watch(self, job_id, gateway_wait_s=600, say=None):
        """Yield events (dicts with state, done, total) until the job ends.

        The job lives in the gateway's queue and goes on without the gateway,
        so a restart of the gateway does not end the watch: while it does not
        answer, watch keeps asking, calls say(message) once (and again when
        it answers), and raises TimeoutError after gateway_wait_s seconds
        without an answer (0 or None: no limit)."""
        asking = True
        last_answer = time.monotonic()
        silent = False
        while True:
            try:
                body = self.call("WATCH", id=job_id) if asking else self._recv(self.timeout_ms)[1]
            except TimeoutError:
                if not asking:
                    asking = True  # quiet: ask again (a restarted gateway forgot the watch)
                    continue
                quiet = time.monotonic() - last_answer
                if not silent and say:
                    say(f"no answer from the gateway for {quiet:.0f} s; still trying (the job is in its "
                        "queue and goes on)")
                silent = True
                if gateway_wait_s and quiet >= gateway_wait_s:
                    raise TimeoutError(f"job {job_id}: gave up after {quiet:.0f} s without an answer from the "
                                       f"gateway; the job stays in its queue: watch {job_id} follows it again")
                continue
            if silent and say:
                say(f"the gateway answers again (after {time.monotonic() - last_answer:.0f} s)")
            silent, asking, last_answer = False, False, time.monotonic()
            if body.get("id") != job_id:
                continue
            yield body
            if body["state"] in TERMINAL:
                return


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connect", default=os.environ.get("SPINDLE_GATEWAY", "tcp://127.0.0.1:7700"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit")
    s.add_argument("pipeline")
    s.add_argument("--input", action="append", default=[])
    s.add_argument("--output", action="append", default=[])
    s.add_argument("--param", action="append", default=[])
    s.add_argument("--priority", type=int)
    s.add_argument("--idempotency-key")
    s.add_argument("--deadline", type=float)
    s.add_argument("--max-attempts", type=int)
    s.add_argument("--timeout", type=float, help="an attempt that runs longer than this many seconds fails")
    s.add_argument("--wait", action="store_true")
    ap.add_argument("--timeout-ms", type=int, default=10000, help="how long one request waits for its answer")
    ap.add_argument("--gateway-wait", type=float, default=600,
                    help="watch, submit --wait: give up after this many seconds without an answer (0: no limit)")
    for name in ("status", "watch", "cancel"):
        sub.add_parser(name).add_argument("id", type=int)
    j = sub.add_parser("jobs")
    j.add_argument("--state")
    a = ap.parse_args()

    def pairs(items, absolute):
        out = {}
        for it in items:
            k, eq, v = it.partition("=")
            if not k or not eq:
                ap.error(f"expected NAME=VALUE, got {it!r}")
            if k in out:  # the second would silently replace the first
                ap.error(f"{k} is given twice")
            out[k] = os.path.abspath(v) if absolute else v
        return out

    c = Client(a.connect, a.timeout_ms)
    try:
        if a.cmd == "submit":
            jid = c.submit(a.pipeline, pairs(a.input, True), pairs(a.output, True), pairs(a.param, False),
                           a.priority, a.idempotency_key, a.deadline, a.max_attempts, a.timeout)
            print(jid)
            if not a.wait:
                return 0
            a.id = jid
        if a.cmd in ("submit", "watch"):
            for ev in c.watch(a.id, a.gateway_wait, lambda m: print(f"client.py: {m}", file=sys.stderr)):
                print(f"job {a.id}: {ev['state']} {ev.get('done', 0)}/{ev.get('total', 0)}", file=sys.stderr)
                if "waiting" in ev:  # queued, and no worker runs its pipeline yet
                    print(f"job {a.id} waiting: {ev['waiting']}", file=sys.stderr)
            print(f"{a.id} {ev['state']}")
            return 0 if ev["state"] == "succeeded" else 1
        if a.cmd == "status":
            print(json.dumps(c.status(a.id), indent=2))
        elif a.cmd == "cancel":
            print(a.id, c.cancel(a.id))
        elif a.cmd == "jobs":
            for job in c.jobs(a.state):
                print(job["id"], job["state"], job["pipeline"], f"{job['done']}/{job['total']}")
        return 0
    except (GatewayError, TimeoutError) as e:
        print(f"client.py: {e}", file=sys.stderr)
        return 5
    finally:
        c.close()


if __name__ == "__main__":
    sys.exit(main())
