#!/usr/bin/env python3
"""Random protocol messages at a real `spindle serve` (SQLite, one slot of
its own): well-framed SPN1 messages of every client and worker type whose
bodies are the documented ones with keys dropped, replaced by values of
other types and sizes, or added, some cut short; sent from several DEALER
sockets that come and go, including as a remote worker that leases,
reports and drops jobs. Asserts that the gateway keeps answering, that a
job submitted afterwards by a well-behaved client still succeeds with its
output, and that the gateway then stops cleanly (exit 0: under ASan, no
error or leak). Seeded: a failure prints the seed to replay.

usage: test-proto-fuzz.py SPINDLE [SECONDS] [SEED]
"""
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import zmq
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

KEYS = ["req", "pipeline", "inputs", "outputs", "params", "priority", "idempotency_key", "deadline", "max_attempts",
        "segments", "segment_seconds", "id", "state", "limit", "versions", "worker", "credit", "pipelines", "jobs",
        "attempt", "done", "total", "compute_s", "gpu_s", "transfers", "warnings", "error", "cancelled", "in", "out",
        "h2d", "d2h", "bytes", "ms"]
TYPES = ["SUBMIT", "STATUS", "WATCH", "CANCEL", "LIST", "HELLO", "WORKERS", "LEASE", "HEARTBEAT", "PROGRESS", "DONE", "FAIL",
         "DRAIN", "RELEASE"]


def templates(tmp):
    w = "fuzzw"
    return {
        "SUBMIT": {"pipeline": "copy", "inputs": {"in": f"{tmp}/in.bin"}, "outputs": {"out": f"{tmp}/out/o.bin"},
                   "params": {"k": "v"}, "priority": 1, "max_attempts": 2},
        "STATUS": {"id": 1}, "WATCH": {"id": 1}, "CANCEL": {"id": 1}, "LIST": {"state": "queued", "limit": 5},
        "HELLO": {"versions": [1]}, "WORKERS": {},
        "LEASE": {"worker": w, "credit": 1, "pipelines": ["copy", "noop"]},
        "HEARTBEAT": {"worker": w, "jobs": [{"id": 1, "attempt": 1}]},
        "PROGRESS": {"worker": w, "id": 1, "attempt": 1, "done": 1, "total": 2},
        "DONE": {"worker": w, "id": 1, "attempt": 1, "compute_s": 0.1, "gpu_s": 0,
                 "transfers": {"h2d": {"bytes": 1, "ms": 1}}, "warnings": ["w"]},
        "FAIL": {"worker": w, "id": 1, "attempt": 1, "error": "e", "cancelled": False, "compute_s": 0, "gpu_s": 0},
        "DRAIN": {"worker": w},
        "RELEASE": {"worker": w, "id": 1, "attempt": 1},
    }


def main():
    spindle = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.randrange(1 << 30)
    rnd = random.Random(seed)
    print(f"seed {seed} ({seconds:.0f} s)")
    tmp = tempfile.mkdtemp(prefix="spn-proto-fuzz-")
    with open(f"{tmp}/in.bin", "wb") as f:
        f.write(os.urandom(4096))
    os.mkdir(f"{tmp}/out")
    log = open(os.path.join(tmp, "serve.log"), "wb")
    gw = subprocess.Popen([spindle, "serve", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/q.db", "--root", tmp,
                           "--workers", "1", "--heartbeat-ms", "200"], stdout=subprocess.PIPE, stderr=log, cwd=tmp)
    ctx = zmq.Context()
    failed = None
    try:
        r, _, _ = select.select([gw.stdout], [], [], 20)
        line = gw.stdout.readline() if r else b""
        if b"ready on " not in line:
            raise SystemExit(f"FAIL: serve not ready: {line!r}")
        ep = line.decode().split("ready on ")[1].strip()

        def sock():
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep)
            return s

        def value(depth=0):
            c = rnd.randrange(12 if depth < 3 else 8)
            if c == 0:
                return rnd.choice([0, -1, 1, 2**31, 2**53 + 1, 2**63, -2**63, 1e308, -0.0, 0.5, 3.5])
            if c in (1, 2, 3):
                return rnd.choice(["", "x", "copy", "noop", "fail", "a" * 300, "\u00e9\u4e2d", "../../etc/passwd",
                                   f"{tmp}/in.bin", f"{tmp}/out/o.bin", f"{tmp}/out", "/", "queued", "running",
                                   "fuzzw", "remote:fuzzw", "x\ny"])
            if c in (4, 5):
                return rnd.choice([True, False, None])
            if c in (6, 7):
                return rnd.randrange(-5, 300)
            if c in (8, 9):
                return [value(depth + 1) for _ in range(rnd.randrange(5))]
            return {rnd.choice(KEYS): value(depth + 1) for _ in range(rnd.randrange(5))}

        tmpl = templates(tmp)

        def message():
            t = rnd.choice(TYPES)
            b = json.loads(json.dumps(tmpl[t]))
            for _ in range(rnd.randrange(4)):
                op = rnd.randrange(4)
                if op == 0 and b:
                    del b[rnd.choice(list(b))]
                elif op == 1 and b:
                    b[rnd.choice(list(b))] = value()
                elif op == 2:
                    b[rnd.choice(KEYS)] = value()
                elif op == 3 and b:
                    k = rnd.choice(list(b))
                    if isinstance(b[k], dict) and b[k]:
                        b[k][rnd.choice(list(b[k]))] = value()
                    elif isinstance(b[k], list) and b[k]:
                        b[k][rnd.randrange(len(b[k]))] = value()
            if rnd.random() < 0.5:
                b["req"] = rnd.randrange(1, 1 << 20)
            raw = json.dumps(b).encode()
            if rnd.random() < 0.03:
                raw = raw[:rnd.randrange(len(raw) + 1)]
            return [b"", b"SPN1", t.encode(), raw]

        def answers():
            c = sock()
            c.send_multipart([b"", b"SPN1", b"HELLO", b'{"req":1,"versions":[1]}'])
            ok = c.poll(10000) and c.recv_multipart()[2] == b"HELLO"
            c.close()
            return ok

        socks = [sock() for _ in range(4)]
        end = time.monotonic() + seconds
        sent = 0
        while time.monotonic() < end and failed is None:
            rnd.choice(socks).send_multipart(message())
            sent += 1
            if rnd.random() < 0.02:
                i = rnd.randrange(len(socks))
                socks[i].close()
                socks[i] = sock()
            if sent % 200 == 0:
                for s in socks:
                    while s.poll(0):
                        s.recv_multipart()
                if gw.poll() is not None:
                    failed = f"the gateway died (exit {gw.returncode}) after {sent} messages"
                elif not answers():
                    failed = f"the gateway stopped answering after {sent} messages"
        for s in socks:
            s.close()
        print(f"{sent} messages sent")
        if failed is None:
            # a well-behaved client afterwards: its job runs (on the
            # gateway's own slot) and its output is the input
            out = f"{tmp}/out/after.bin"
            r = subprocess.run([spindle, "submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={out}",
                                "--wait", "--connect", ep], capture_output=True, timeout=120, cwd=tmp)
            if r.returncode != 0:
                failed = f"a job submitted after the fuzzing: exit {r.returncode} {r.stderr!r}"
            elif open(out, "rb").read() != open(f"{tmp}/in.bin", "rb").read():
                failed = "a job submitted after the fuzzing: its output is not its input"
        if gw.poll() is None:
            gw.send_signal(signal.SIGINT)
            try:
                gw.wait(30)
            except subprocess.TimeoutExpired:
                gw.kill()
                gw.wait()
        if failed is None and gw.returncode != 0:
            failed = f"the gateway exited {gw.returncode} on SIGINT"
    finally:
        if gw.poll() is None:
            gw.kill()
            gw.wait()
        ctx.term()
        if failed:
            print(open(os.path.join(tmp, "serve.log"), errors="replace").read()[-5000:])
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        print(f"FAIL (seed {seed}): {failed}")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
