#!/usr/bin/env python3
"""Integration tests of the job service: real `spindle serve` and
`spindle worker` processes on 127.0.0.1, driven through the `spindle` client
commands and raw ZeroMQ (pyzmq). Every process is started by this script and
killed at the end, and every wait is bounded.

usage: test-jobs.py SPINDLE_BINARY CASE [SAMPLE] [--backend sqlite|redis]
With --backend redis every gateway shares a Redis queue: a redis-server is
started per case on a free loopback port with appendonly on, in the case's
temporary folder. Prints "N passed, M failed" last."""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from freeport import free_port  # noqa: E402  (drawn below the ephemeral range: tests/common/freeport.py)

SPINDLE = None
SAMPLE_C = None
PROCS = []
BACKEND = "sqlite"
REDIS = {}  # the case's redis-server: proc, port, dir, url


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise Fail(f"timed out after {timeout}s waiting for {what}")


def start_redis(tmp, port=None):
    """redis-server on loopback with appendonly on (appendfsync everysec, or
    REDIS["fsync"] when a case set it), its AOF in tmp/redis; restarted on
    the same port and folder it reloads the AOF."""
    d = os.path.join(tmp, "redis")
    os.makedirs(d, exist_ok=True)
    port = port or free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                          "--appendonly", "yes", "--appendfsync", REDIS.get("fsync", "everysec"),
                          "--save", ""],
                         stdout=open(os.path.join(tmp, "redis.log"), "ab"), stderr=subprocess.STDOUT)
    PROCS.append(p)
    import socket

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as so:
                so.sendall(b"PING\r\n")
                return so.recv(64).startswith(b"+PONG")
        except OSError:
            return False
    wait_for(up, 20, "redis-server to answer")
    REDIS.update(proc=p, port=port, dir=d, url=f"redis://127.0.0.1:{port}")
    return p, REDIS["url"]


def redis_call(*args):
    """One command to the case's redis-server (RESP over a socket)."""
    import socket
    with socket.create_connection(("127.0.0.1", REDIS["port"]), timeout=5) as so:
        so.sendall(f"*{len(args)}\r\n".encode() + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in (str(x).encode() for x in args)))
        return resp_read(so.makefile("rb"))


def resp_read(f):
    line = f.readline()[:-2]
    kind, rest = line[:1], line[1:].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise Fail(f"redis: {rest}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        return None if int(rest) < 0 else f.read(int(rest) + 2)[:-2].decode()
    if kind == b"*":
        return None if int(rest) < 0 else [resp_read(f) for _ in range(int(rest))]
    raise Fail(f"redis: unexpected reply {line!r}")


def keda_signals():
    """What deploy/keda/scaledobject-redis-streams.yaml reads: the lag of
    group spindle on spindle:waiting (queued jobs) and its pending entries on
    spindle:run (running jobs)."""
    def group(stream):
        for g in redis_call("XINFO", "GROUPS", stream):
            d = dict(zip(g[::2], g[1::2]))
            if d["name"] == "spindle":
                return d
        raise Fail(f"{stream}: no consumer group spindle")
    return group("spindle:waiting")["lag"], group("spindle:run")["pending"]


def queue_args(tmp):
    if BACKEND != "redis":
        return []
    if "proc" not in REDIS or REDIS["proc"].poll() is not None:
        start_redis(tmp, REDIS.get("port"))
    return ["--queue", REDIS["url"]]


def start_serve(tmp, *args, db="q.db", bind="tcp://127.0.0.1:*", log="serve.log"):
    out = open(os.path.join(tmp, log), "ab")
    p = subprocess.Popen([SPINDLE, "serve", "--bind", bind, "--db", os.path.join(tmp, db),
                          "--root", tmp, *queue_args(tmp), *args], stdout=subprocess.PIPE, stderr=out,
                         cwd=tmp)
    PROCS.append(p)
    line = b""
    end = time.monotonic() + 20
    import select
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            line = p.stdout.readline()
            break
        if p.poll() is not None:
            break
    if b"ready on " not in line:
        raise Fail(f"spindle serve did not become ready: {line!r}; log: "
                   + open(os.path.join(tmp, log), "rb").read().decode(errors="replace"))
    return p, line.decode().split("ready on ")[1].strip()


def read_until(stream, needle, secs):
    """Bytes read from a pipe until needle is among them, or secs pass (the
    caller checks); lets a case wait for what a client has printed before it
    changes what that client is watching."""
    import select
    got = b""
    end = time.monotonic() + secs
    while needle not in got and time.monotonic() < end:
        r, _, _ = select.select([stream], [], [], 0.2)
        if r:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    return got


def start_worker(tmp, ep, *args, name="w", log=None):
    """A worker on a gateway (ep "tcp://...") or on the Redis queue (ep "redis://...")."""
    out = open(os.path.join(tmp, log or f"worker-{name}.log"), "ab")
    how = ["--queue", ep] if ep.startswith("redis://") else ["--connect", ep]
    p = subprocess.Popen([SPINDLE, "worker", *how, "--name", name, *args],
                         stdout=out, stderr=out, cwd=tmp)
    PROCS.append(p)
    return p


def cli(*args, timeout=60, check_rc=None):
    r = subprocess.run([SPINDLE, *args], capture_output=True, timeout=timeout)
    if check_rc is not None and r.returncode != check_rc:
        raise Fail(f"spindle {' '.join(args)}: exit {r.returncode}, expected {check_rc}; "
                   f"stdout={r.stdout.decode()!r} stderr={r.stderr.decode()!r}")
    return r


def status(ep, jid):
    r = cli("status", str(jid), "--connect", ep, check_rc=0)
    return json.loads(r.stdout)


def make_file(path, size, seed):
    data = hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1)
    with open(path, "wb") as f:
        f.write(data[:size])


def same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def stray_files(d):
    return [f for f in os.listdir(d) if ".spn-" in f]


class Raw:
    """A raw DEALER speaking the protocol, for malformed-frame tests."""

    def __init__(self, ctx, ep, curve=None):
        self.s = ctx.socket(zmq.DEALER)
        self.s.setsockopt(zmq.LINGER, 0)
        for k, v in (curve or {}).items():
            self.s.setsockopt(k, v)
        self.s.connect(ep)

    def send(self, *frames):
        self.s.send_multipart([f if isinstance(f, bytes) else f.encode() for f in frames])

    def req(self, type_, body):
        self.send(b"", b"SPN1", type_, json.dumps(body))

    def recv(self, timeout=5000):
        if not self.s.poll(timeout):
            return None
        fr = self.s.recv_multipart()
        check(len(fr) == 4 and fr[0] == b"" and fr[1] == b"SPN1", f"bad reply framing {fr!r}")
        return fr[2].decode(), json.loads(fr[3])

    def close(self):
        self.s.close(0)


# ---------------------------------------------------------------- cases

def case_basic(tmp):
    p, ep = start_serve(tmp, "--workers", "2", "--chunk-bytes", "4096", "--max-attempts", "2",
                        "--backoff-ms", "50")
    make_file(f"{tmp}/in.bin", 100_000, 1)
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out.bin",
            "--param", "chunk_delay_ms=20", "--wait", "--connect", ep, check_rc=0)
    check(b"succeeded" in r.stdout, f"submit --wait output: {r.stdout!r}")
    check(same(f"{tmp}/in.bin", f"{tmp}/out.bin"), "output differs from input")
    jid = int(r.stdout.split()[0])
    st = status(ep, jid)
    check(st["state"] == "succeeded" and st["attempts"] == 1, f"status {st}")
    check(st["done"] == st["total"] == 25, f"progress recorded: {st['done']}/{st['total']} (want 25/25)")
    check(all(k in st["times"] for k in ("queued", "running", "succeeded")), f"times {st['times']}")
    check(st["times"]["queued"] <= st["times"]["running"] <= st["times"]["succeeded"], "time order")
    # plain (non-TTY) progress lines
    check(b"running" in r.stderr and b"frames" in r.stderr, f"progress lines: {r.stderr!r}")
    # on a terminal: a live progress bar with frames, fps and ETA
    import pty
    master, slave = pty.openpty()
    pr = subprocess.Popen([SPINDLE, "submit", "copy", "--input", f"in={tmp}/in.bin", "--output",
                           f"out={tmp}/tty.bin", "--param", "chunk_delay_ms=20", "--wait", "--connect", ep],
                          stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    tty = b""
    while True:
        try:
            d = os.read(master, 4096)
        except OSError:
            break
        if not d:
            break
        tty += d
    os.close(master)
    check(pr.wait(30) == 0, "submit --wait on a TTY")
    check(b"[##############################] 25/25 frames" in tty and b" fps  ETA " in tty and b"\r" in tty,
          f"TTY progress bar: {tty[-300:]!r}")
    # relative paths are resolved by the client
    r = cli("submit", "copy", "--input", "in=in.bin", "--output", "out=rel.bin", "--wait",
            "--connect", ep, check_rc=None)
    # (cwd of the client is not tmp: relative to our cwd; expect refusal as it is outside roots)
    check(r.returncode == 5, f"relative path outside the root: exit {r.returncode}")
    # idempotency
    a = cli("submit", "noop", "--idempotency-key", "abc", "--connect", ep, check_rc=0).stdout.split()
    b = cli("submit", "noop", "--idempotency-key", "abc", "--connect", ep, check_rc=0).stdout.split()
    check(a[0] == b[0] and b[1:] == [b"existed"], f"idempotent resubmit: {a} vs {b}")
    # failing pipeline: retried, then dead with every attempt's error (exit 4)
    r = cli("submit", "fail", "--param", "reason=disk on fire", "--wait", "--connect", ep, check_rc=4)
    jid = int(r.stdout.split()[0])
    st = status(ep, jid)
    check(st["state"] == "dead" and len(st["errors"]) == 2, f"dead job {st}")
    check(all("disk on fire" in e["error"] for e in st["errors"]), f"errors {st['errors']}")
    # succeeds on the second attempt
    r = cli("submit", "fail", "--param", "succeed_at=2", "--input", f"in={tmp}/in.bin",
            "--output", f"out={tmp}/out2.bin", "--wait", "--connect", ep, check_rc=0)
    st = status(ep, int(r.stdout.split()[0]))
    check(st["attempts"] == 2 and len(st["errors"]) == 1, f"retried job {st}")
    check(same(f"{tmp}/in.bin", f"{tmp}/out2.bin"), "retried output differs")
    # cancel a running job: stops between chunks, leaves no output
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/cancelled.bin",
            "--param", "chunk_delay_ms=100", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 2, 10, "the job to make progress")
    cli("cancel", str(jid), "--connect", ep, check_rc=0)
    w = cli("watch", str(jid), "--connect", ep, check_rc=3)
    check(b"cancelled" in w.stdout, f"watch after cancel: {w.stdout!r}")
    st = status(ep, jid)
    check(st["done"] < 25, f"cancel did not stop the job early: {st['done']}/25")
    check(not os.path.exists(f"{tmp}/cancelled.bin"), "cancelled job left an output")
    check(stray_files(tmp) == [], f"temporary files left: {stray_files(tmp)}")
    # cancel a queued job (deadline + queued behind a long one with 2 workers busy)
    longs = [int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/l{i}.bin",
                     "--param", "chunk_delay_ms=240", "--connect", ep, check_rc=0).stdout.split()[0])
             for i in range(2)]  # 6 s each: still running under a loaded CI machine or ASan
    q = int(cli("submit", "noop", "--priority", "-5", "--connect", ep, check_rc=0).stdout.split()[0])
    dl = int(cli("submit", "noop", "--priority", "-5", "--deadline", "0.3", "--connect", ep,
                 check_rc=0).stdout.split()[0])
    check(status(ep, q)["state"] == "queued", "job behind busy workers is queued")
    r = cli("cancel", str(q), "--connect", ep, check_rc=0)
    check(r.stdout.split()[1] == b"cancelled", f"cancel queued: {r.stdout!r}")
    st = wait_for(lambda: (lambda s: s if s["state"] == "failed" else None)(status(ep, dl)), 10,
                  "the deadline to pass")
    check("deadline" in st["reason"], f"deadline reason {st}")
    for l in longs:
        cli("watch", str(l), "--connect", ep, check_rc=0)
    r = cli("jobs", "--state", "cancelled", "--connect", ep, check_rc=0)
    rows = [l.split()[:2] for l in r.stdout.decode().splitlines()[1:]]
    check(sorted(rows) == sorted([[str(jid), "cancelled"], [str(q), "cancelled"]]),
          f"jobs --state cancelled: {r.stdout!r}")
    check(p.poll() is None, "gateway died")


def case_thousand(tmp):
    p, ep = start_serve(tmp, "--workers", "2")
    os.mkdir(f"{tmp}/in")
    os.mkdir(f"{tmp}/out")
    n = 1000
    for i in range(n):
        make_file(f"{tmp}/in/{i}.bin", 1000 + i, i)
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    for i in range(n):
        c.req("SUBMIT", {"req": i + 1, "pipeline": "copy", "inputs": {"in": f"{tmp}/in/{i}.bin"},
                         "outputs": {"out": f"{tmp}/out/{i}.bin"}})
    ids = {}
    while len(ids) < n:
        m = c.recv(20000)
        check(m is not None, f"only {len(ids)} of {n} submissions acknowledged")
        t, b = m
        check(t == "SUBMITTED", f"submit refused: {t} {b}")
        ids[b["req"]] = b["id"]
    check(len(set(ids.values())) == n, "job ids not unique")

    def all_done():
        c.req("LIST", {"req": 10**6, "state": "succeeded", "limit": 1000})
        while True:
            m = c.recv(5000)
            check(m is not None, "LIST unanswered")
            if m[1].get("req") == 10**6:
                return len(m[1]["jobs"]) == n
    wait_for(all_done, 120, "1000 jobs to succeed")
    for i in range(n):
        check(same(f"{tmp}/in/{i}.bin", f"{tmp}/out/{i}.bin"), f"output {i} differs")
    check(stray_files(f"{tmp}/out") == [], "temporary files left")
    c.close()
    ctx.term()


def case_worker_kill(tmp):
    # remote workers only; heartbeat 200 ms so "3 missed" takes 0.6 s
    p, ep = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "200", "--lease-ms", "2000",
                        "--backoff-ms", "50")
    log = f"{tmp}/exec.log"
    ws = {name: start_worker(tmp, ep, "--chunk-bytes", "8192", "--heartbeat-ms", "200",
                             "--exec-log", log, name=name) for name in ("wa", "wb")}
    make_file(f"{tmp}/in.bin", 400_000, 7)
    os.mkdir(f"{tmp}/out")
    # undisturbed reference run
    cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/ref.bin",
        "--wait", "--connect", ep, check_rc=0)
    # 49 chunks * 60 ms: about 3 s of work
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out/victim.bin",
            "--param", "chunk_delay_ms=60", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    st = wait_for(lambda: (lambda s: s if s["state"] == "running" and s["done"] >= 5 else None)(status(ep, jid)),
                  20, "the job to run on a worker")
    owner = st["worker"].split(":", 1)[1]
    check(owner in ws, f"unexpected owner {st['worker']}")
    ws[owner].send_signal(signal.SIGKILL)
    ws[owner].wait()
    w = cli("watch", str(jid), "--connect", ep, timeout=60, check_rc=0)
    st = status(ep, jid)
    check(st["attempts"] == 2, f"job should have run twice, attempts={st['attempts']}")
    check("lost" in st["errors"][0]["error"], f"first attempt error: {st['errors']}")
    other = [n for n in ws if n != owner][0]
    check(st["times"]["succeeded"] > 0, "no success time")
    check(same(f"{tmp}/ref.bin", f"{tmp}/out/victim.bin"), "output differs from the undisturbed run")
    check(os.listdir(f"{tmp}/out") == ["victim.bin"], f"exactly one output expected: {os.listdir(f'{tmp}/out')}")
    done = [l for l in open(log).read().split("\n") if l.startswith(f"done {jid} ")]
    check(done == [f"done {jid} 2"], f"completions of job {jid}: {done}")
    check(ws[other].poll() is None, "the surviving worker exited")


def case_gateway_kill(tmp):
    log = f"{tmp}/exec.log"
    args = ["--workers", "2", "--lease-ms", "1500", "--chunk-bytes", "4096", "--exec-log", log]
    p, ep = start_serve(tmp, *args)
    os.mkdir(f"{tmp}/out")
    # 20 chunks of 10 ms: each job runs ~0.2 s, so the kill lands mid-job for
    # the running ones (not in the ~0.1 ms between a run's end and its commit)
    make_file(f"{tmp}/in.bin", 80_000, 3)
    n = 100
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    for i in range(n):
        c.req("SUBMIT", {"req": i + 1, "pipeline": "copy", "inputs": {"in": f"{tmp}/in.bin"},
                         "outputs": {"out": f"{tmp}/out/{i}.bin"}, "params": {"chunk_delay_ms": 10}})
    ids = set()
    for _ in range(n):
        m = c.recv(10000)
        check(m and m[0] == "SUBMITTED", f"submit: {m}")
        ids.add(m[1]["id"])
    c.close()
    # let some finish and some run, then kill -9
    wait_for(lambda: len([f for f in os.listdir(f"{tmp}/out") if not f.startswith(".")]) >= 10, 60,
             "some jobs to finish")
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = len([f for f in os.listdir(f"{tmp}/out") if f.endswith(".bin") and not f.startswith(".")])
    check(before < n, "all jobs finished before the kill; the test proves nothing")
    port = ep.rsplit(":", 1)[1]
    p2, ep2 = start_serve(tmp, *args, bind=f"tcp://127.0.0.1:{port}")
    c = Raw(ctx, ep2)

    def done():
        c.req("LIST", {"req": 7, "state": "succeeded", "limit": 1000})
        m = c.recv(5000)
        return m and len(m[1]["jobs"]) == n
    wait_for(done, 120, "all 100 jobs to succeed after the restart")
    c.close()
    ctx.term()
    lines = [l.split() for l in open(log).read().splitlines()]
    dones = {}
    for l in lines:
        if l[0] == "done":
            dones[int(l[1])] = dones.get(int(l[1]), 0) + 1
    check(set(dones) == ids, f"{len(set(dones))} of {n} jobs completed")
    twice = [j for j, k in dones.items() if k != 1]
    check(not twice, f"jobs completed more than once: {twice}")
    for i in range(n):
        check(same(f"{tmp}/in.bin", f"{tmp}/out/{i}.bin"), f"output {i} differs")
    check(stray_files(f"{tmp}/out") == [], f"temporary files left: {stray_files(tmp + '/out')}")
    restarted = sum(1 for l in lines if l[0] == "start" and l[2] != "1")
    print(f"gateway-kill: {before} outputs before the kill, {restarted} jobs re-run after it")


def case_malformed(tmp):
    p, ep = start_serve(tmp, "--workers", "1", "--max-msg", "65536")
    ctx = zmq.Context()
    c = Raw(ctx, ep)

    def expect(code, *frames):
        c.send(*frames)
        m = c.recv()
        check(m is not None, f"no reply to {frames!r}")
        check(m[0] == "ERROR" and m[1]["code"] == code, f"{frames!r}: expected {code}, got {m}")

    expect("bad_frame", b"", b"SPN1", b"HELLO")                      # 3 frames
    expect("bad_frame", b"", b"SPN1", b"HELLO", b"{}", b"extra")     # 5 frames
    expect("bad_frame", b"x", b"SPN1", b"HELLO", b"{}")              # no delimiter
    expect("bad_frame", b"", b"ABCD", b"HELLO", b"{}")               # not our magic
    expect("unsupported_version", b"", b"SPN9", b"HELLO", b"{}")     # future version
    expect("bad_frame", b"", b"SPN1", b"hello", b"{}")               # bad type chars
    expect("bad_frame", b"", b"SPN1", b"", b"{}")                    # empty type
    expect("bad_json", b"", b"SPN1", b"SUBMIT", b"{\"pipeline\": ")  # truncated JSON
    expect("bad_json", b"", b"SPN1", b"SUBMIT", b"[1,2]")            # not an object
    expect("bad_json", b"", b"SPN1", b"SUBMIT", b"{} trailing")      # junk after
    expect("bad_json", b"", b"SPN1", b"SUBMIT", b"\xff\xfe")         # not UTF-8 JSON
    expect("unknown_type", b"", b"SPN1", b"FROB", b"{}")
    expect("invalid", b"", b"SPN1", b"SUBMIT", b"{\"pipeline\": 3}")
    expect("unknown_pipeline", b"", b"SPN1", b"SUBMIT", b"{\"pipeline\": \"nope\"}")
    # the message lists what this gateway takes (a typo is then plain to see)
    r = cli("submit", "cpoy", "--connect", ep, check_rc=5)
    check(b'unknown pipeline "cpoy" (this gateway takes: copy, fail, noop)' in r.stderr, r.stderr)
    expect("invalid", b"", b"SPN1", b"SUBMIT", b"{\"pipeline\": \"copy\", \"inputs\": 1}")
    # one name twice in a JSON object: refused, whichever the parser would keep
    f = f"{tmp}/dup.bin".encode()
    make_file(f"{tmp}/dup.bin", 10, 3)
    for body in (b'{"pipeline": "copy", "inputs": {"in": "' + f + b'", "in": "' + f + b'"}}',
                 b'{"pipeline": "copy", "inputs": {"in": "' + f + b'"}, "outputs": {"out": "' + f + b'.o", "out": "'
                 + f + b'.p"}}',
                 b'{"pipeline": "copy", "params": {"a": 1, "a": 2}}'):
        c.send(b"", b"SPN1", b"SUBMIT", body)
        m = c.recv()
        check(m and m[0] == "ERROR" and m[1]["code"] == "invalid" and "is given twice" in m[1]["message"],
              f"{body!r}: {m}")
    # and spindle submit says so before it sends anything
    for args in (["--input", "in=/a", "--input", "in=/b"], ["--param", "k=1", "--param", "k=2"]):
        r = cli("submit", "copy", *args, "--connect", ep, check_rc=2)
        check(b"is given twice" in r.stderr, r.stderr)
    expect("invalid", b"", b"SPN1", b"STATUS", b"{\"id\": \"x\"}")
    expect("not_found", b"", b"SPN1", b"STATUS", b"{\"id\": 12345}")
    expect("invalid", b"", b"SPN1", b"LIST", b"{\"state\": \"weird\"}")
    expect("invalid", b"", b"SPN1", b"LEASE", b"{\"credit\": 1}")    # worker without a name
    # the pipelines a worker runs: an array of names without newlines
    for bad in (b'"copy"', b'[3]', b'["co\\npy"]', b'[""]', b'["' + b"p" * 129 + b'"]'):
        expect("invalid", b"", b"SPN1", b"LEASE", b'{"worker": "m", "credit": 1, "pipelines": ' + bad + b'}')
    expect("unsupported_version", b"", b"SPN1", b"HELLO", b"{\"versions\": [2]}")
    # a request id is echoed on errors
    c.req("STATUS", {"req": 99, "id": -1})
    m = c.recv()
    check(m[1].get("req") == 99 and m[1]["code"] == "invalid", f"req echo: {m}")
    # oversize: the connection is dropped, nothing answers, the server lives
    big = Raw(ctx, ep)
    big.send(b"", b"SPN1", b"SUBMIT", b"{\"pipeline\": \"" + b"a" * 100_000 + b"\"}")
    check(big.recv(1000) is None, "oversize message got a reply")
    big.close()
    # a random garbage burst
    import random
    rnd = random.Random(5)
    for _ in range(200):
        c.send(*[bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 20))) for _ in range(rnd.randint(1, 6))])
    # the gateway still serves: a new client negotiates and runs a job
    c2 = Raw(ctx, ep)
    c2.req("HELLO", {"req": 1, "versions": [1]})
    m = c2.recv()
    while m and m[0] != "HELLO":
        m = c2.recv()
    check(m and m[1]["version"] == 1 and m[1]["max_msg_size"] == 65536, f"HELLO reply {m}")
    cli("submit", "noop", "--wait", "--connect", ep, check_rc=0)
    check(p.poll() is None, "gateway died")
    c.close()
    c2.close()
    ctx.term()


def case_curve(tmp):
    cli("keygen", f"{tmp}/server", check_rc=0)
    cli("keygen", f"{tmp}/good", check_rc=0)
    cli("keygen", f"{tmp}/bad", check_rc=0)
    os.mkdir(f"{tmp}/clients")
    shutil.copy(f"{tmp}/good.pub", f"{tmp}/clients/good.pub")
    p, ep = start_serve(tmp, "--workers", "1", "--curve-keyfile", f"{tmp}/server.key",
                        "--curve-clients", f"{tmp}/clients")
    srv = ["--server-key-file", f"{tmp}/server.pub"]
    r = cli("submit", "noop", "--wait", "--connect", ep, "--curve-keyfile", f"{tmp}/good.key", *srv,
            check_rc=0)
    check(b"succeeded" in r.stdout, "allowed client")
    r = cli("submit", "noop", "--connect", ep, "--timeout-ms", "1500", "--curve-keyfile",
            f"{tmp}/bad.key", *srv, check_rc=5)
    check(b"no answer" in r.stderr, f"refused client: {r.stderr!r}")
    r = cli("submit", "noop", "--connect", ep, "--timeout-ms", "1500", check_rc=5)
    check(b"no answer" in r.stderr, f"plain client: {r.stderr!r}")
    check(b"refused a CURVE client" in open(f"{tmp}/serve.log", "rb").read(), "refusal logged")
    # the allow-list is read per connection: adding a key lets that client in
    shutil.copy(f"{tmp}/bad.pub", f"{tmp}/clients/now-good.pub")
    cli("submit", "noop", "--wait", "--connect", ep, "--curve-keyfile", f"{tmp}/bad.key", *srv,
        check_rc=0)
    check(p.poll() is None, "gateway died")
    # remote workers: one without an allowed key gets nothing, one with a
    # client key may not act as a worker, one with a worker key runs the job
    os.remove(f"{tmp}/clients/now-good.pub")
    cli("keygen", f"{tmp}/wk", check_rc=0)
    os.mkdir(f"{tmp}/workers")
    shutil.copy(f"{tmp}/wk.pub", f"{tmp}/workers/wk.pub")
    p2, ep2 = start_serve(tmp, "--workers", "0", "--curve-keyfile", f"{tmp}/server.key",
                          "--curve-clients", f"{tmp}/clients", "--curve-workers", f"{tmp}/workers",
                          db="q2.db", log="serve2.log")
    wbad = start_worker(tmp, ep2, "--curve-keyfile", f"{tmp}/bad.key", *srv, name="wbad")
    good = ["--curve-keyfile", f"{tmp}/good.key", *srv]
    start_worker(tmp, ep2, *good, name="wclient")
    jid = int(cli("submit", "noop", "--connect", ep2, *good, check_rc=0).stdout.split()[0])
    time.sleep(1.5)
    st = json.loads(cli("status", str(jid), "--connect", ep2, *good, check_rc=0).stdout)
    check(st["state"] == "queued", f"a worker without a worker key got the job: {st}")
    check(b"worker messages need a worker key" in open(f"{tmp}/worker-wclient.log", "rb").read(),
          "client-key worker was not told why")
    # the worker whose key the gateway refused hears nothing, and says what to check
    wait_for(lambda: b"no answer from the gateway at " + ep2.encode() in open(f"{tmp}/worker-wbad.log", "rb").read(),
             15, "the worker with a refused key to say that the gateway does not answer")
    check(b"curve_workers_dir" in open(f"{tmp}/worker-wbad.log", "rb").read(), "what to check")
    # and stops on SIGTERM (before, it hung in a send that no connection took)
    wbad.send_signal(signal.SIGTERM)
    try:
        check(wbad.wait(15) == 0, f"the worker with a refused key exited {wbad.returncode} after SIGTERM")
    except subprocess.TimeoutExpired:
        raise Fail("the worker with a refused key did not stop on SIGTERM")
    # a client key cannot forge a worker report either
    ctx = zmq.Context()
    pub, sec = open(f"{tmp}/good.key").read().split("public=")[1].split("\nsecret=")
    spub = open(f"{tmp}/server.pub").read().strip()
    forger = Raw(ctx, ep2, {zmq.CURVE_SERVERKEY: spub.encode(), zmq.CURVE_PUBLICKEY: pub.encode(),
                              zmq.CURVE_SECRETKEY: sec.strip().encode()})
    forger.req("DONE", {"req": 5, "worker": "wclient", "id": jid, "attempt": 1})
    m = forger.recv()
    check(m and m[0] == "ERROR" and m[1]["code"] == "forbidden", f"forged DONE: {m}")
    forger.close()
    ctx.term()
    start_worker(tmp, ep2, "--curve-keyfile", f"{tmp}/wk.key", *srv, name="wgood")
    r = cli("watch", str(jid), "--connect", ep2, *good, check_rc=0)
    st = json.loads(cli("status", str(jid), "--connect", ep2, *good, check_rc=0).stdout)
    check(st["state"] == "succeeded", f"allowed worker: {st}")


def case_paths(tmp):
    root = f"{tmp}/root"
    os.mkdir(root)
    os.mkdir(f"{tmp}/outside")
    make_file(f"{root}/in.bin", 1000, 1)
    make_file(f"{tmp}/outside/secret", 1000, 2)
    os.symlink(f"{tmp}/outside/secret", f"{root}/link-to-secret")
    os.symlink(f"{tmp}/outside", f"{root}/linkdir")
    os.symlink(f"{tmp}/outside/secret", f"{root}/out-link")
    out = open(f"{tmp}/serve.log", "ab")
    p = subprocess.Popen([SPINDLE, "serve", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/q.db",
                          "--root", root], stdout=subprocess.PIPE, stderr=out)
    PROCS.append(p)
    ep = p.stdout.readline().decode().split("ready on ")[1].strip()

    def refused(inp, outp, what):
        r = cli("submit", "copy", "--input", f"in={inp}", "--output", f"out={outp}", "--connect", ep,
                check_rc=5)
        check(b"forbidden_path" in r.stderr or b"not_found" in r.stderr or b"invalid" in r.stderr,
              f"{what}: {r.stderr!r}")
        return r.stderr

    e = refused(f"{tmp}/outside/secret", f"{root}/o.bin", "input outside")
    check(b"outside the allowed input roots" in e, e)
    e = refused(f"{root}/../outside/secret", f"{root}/o.bin", "input .. escape")
    check(b"outside" in e, e)
    e = refused(f"{root}/link-to-secret", f"{root}/o.bin", "input symlink escape")
    check(b"outside" in e, e)
    e = refused(f"{root}/in.bin", f"{tmp}/outside/o.bin", "output outside")
    check(b"outside the allowed output roots" in e, e)
    e = refused(f"{root}/in.bin", f"{root}/linkdir/o.bin", "output through a symlinked dir")
    check(b"outside" in e, e)
    e = refused(f"{root}/in.bin", f"{root}/out-link", "output over a symlink")
    check(b"not a regular file" in e, e)
    e = refused(f"{root}/in.bin", f"{root}/..", "output ..")
    # the job's own input as its output: refused however it is spelled (a
    # retry would read the job's own output), and the input is untouched
    os.link(f"{root}/in.bin", f"{root}/hard.bin")
    before = open(f"{root}/in.bin", "rb").read()
    via_dots = f"{root}/../{os.path.basename(root)}/in.bin"
    for outp, what in [(f"{root}/in.bin", "the input's path"), (via_dots, "the input via .."),
                       (f"{root}/hard.bin", "a hard link to the input")]:
        e = refused(f"{root}/in.bin", outp, f"output = input ({what})")
        check(b"invalid" in e and b"is the file of inputs.in" in e and b"never writes over its own input" in e,
              f"output = input ({what}): {e!r}")
    check(open(f"{root}/in.bin", "rb").read() == before, "the input changed")
    check(not os.path.exists(f"{tmp}/outside/o.bin"), "wrote outside the root")
    check(open(f"{tmp}/outside/secret", "rb").read() == open(f"{tmp}/outside/secret", "rb").read(), "")
    cli("submit", "copy", "--input", f"in={root}/in.bin", "--output", f"out={root}/ok.bin", "--wait",
        "--connect", ep, check_rc=0)
    check(same(f"{root}/in.bin", f"{root}/ok.bin"), "allowed copy")
    check(p.poll() is None, "gateway died")


def case_config(tmp):
    # a gateway's endpoint and a queue's URL mixed up: said, with which option takes which
    for args, want in [(["worker", "--connect", "redis://127.0.0.1:6379"], "--connect takes a gateway's tcp://"),
                       (["worker", "--queue", "tcp://127.0.0.1:7700"], "a gateway's endpoint: spindle worker --connect"),
                       (["submit", "noop", "--connect", "redis://127.0.0.1:6379"], "a gateway's tcp:// endpoint, not")]:
        r = cli(*args, timeout=20)
        check(r.returncode != 0 and want in r.stderr.decode(), f"spindle {' '.join(args)}: {r}")
    # a flag outside the range its config key has (a lease of 5 ms would expire
    # before any job ran; --lease-ms is milliseconds): a usage error naming both,
    # before anything starts (before, a gateway ran with it)
    for args, want in [(["serve", "--lease-ms", "5"], "--lease-ms 5: outside [100, 3600000], the range of queue.lease_ms"),
                       (["serve", "--workers", "1000"], "--workers 1000: outside [0, 256], the range of server.workers"),
                       (["serve", "--max-attempts", "0"], "--max-attempts 0: outside [1, 100]"),
                       (["worker", "--connect", "tcp://127.0.0.1:9", "--heartbeat-ms", "0"],
                        "--heartbeat-ms 0: outside [50, 60000], the range of queue.heartbeat_ms"),
                       (["worker", "--connect", "tcp://127.0.0.1:9", "--cancel-grace", "100000"],
                        "--cancel-grace 100000: outside [0, 86400], the range of server.cancel_grace_s")]:
        r = cli(*args, "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/r.db", timeout=20) if args[0] == "serve" \
            else cli(*args, timeout=20)
        check(r.returncode == 2 and want in r.stderr.decode(), f"spindle {' '.join(args)}: {r}")
    cfg = os.path.join(os.environ.get("SPINDLE_SOURCE_ROOT", "."), "configs", "server.toml")
    p, ep = start_serve(tmp, "--config", cfg)  # roots "." = tmp, the server's working directory
    make_file(f"{tmp}/a.bin", 150_000, 9)
    cli("submit", "copy", "--input", f"in={tmp}/a.bin", "--output", f"out={tmp}/b.bin", "--wait",
        "--connect", ep, check_rc=0)
    check(same(f"{tmp}/a.bin", f"{tmp}/b.bin"), "copy under the configured roots")
    # configs/server.toml loads the synthetic pipeline (configs/synthetic-job.toml)
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/s.raw", "--param", "frames=5", "--wait",
            "--connect", ep, check_rc=0)
    check(read(f"{tmp}/s.raw") == synth_expected(int(r.stdout.split()[0]), 5), "synthetic via configs/server.toml")
    with open(f"{tmp}/badpipe.toml", "w") as f:
        f.write('[[pipeline]]\nname = "x"\nconfig = "nothere.toml"\n')
    r = cli("serve", "--config", f"{tmp}/badpipe.toml", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/b.db",
            check_rc=1)
    check(b"badpipe.toml:1:1" in r.stderr and b"nothere.toml" in r.stderr, f"missing pipeline config: {r.stderr!r}")
    # a binding to a key that is not per job: refused at start-up with its position
    with open(f"{tmp}/bind.toml", "w") as f:
        f.write('[pipeline]\nname = "b"\n[pipeline.params]\nwide = "source.width"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\n'
                '[[stage]]\nname = "sink"\nkind = "filesink"\ninputs = ["source"]\n')
    with open(f"{tmp}/bindsrv.toml", "w") as f:
        f.write('[[pipeline]]\nname = "b"\nconfig = "bind.toml"\n')
    r = cli("serve", "--config", f"{tmp}/bindsrv.toml", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/b.db",
            check_rc=1)
    check(b"bind.toml:4:8: [pipeline.params] wide: stage \"source\": key \"width\" is set per pipeline" in r.stderr,
          f"bad binding: {r.stderr!r}")
    r = cli("serve", "--config", f"{tmp}/missing.toml", check_rc=1)
    check(b"missing.toml" in r.stderr, f"missing config: {r.stderr!r}")


def case_samples(tmp):
    p, ep = start_serve(tmp, "--workers", "1", "--chunk-bytes", "1000")
    make_file(f"{tmp}/in.bin", 5000, 4)
    r = subprocess.run([SAMPLE_C, ep, "copy", f"in={tmp}/in.bin", f"out={tmp}/c.bin"],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, f"samples/c/submit: {r.returncode} {r.stdout!r} {r.stderr!r}")
    check(b"finished: succeeded" in r.stdout, r.stdout)
    check(same(f"{tmp}/in.bin", f"{tmp}/c.bin"), "C sample output")
    r = subprocess.run([SAMPLE_C, ep, "fail"], capture_output=True, timeout=60)
    check(r.returncode == 1 and b"dead" in r.stdout, f"C sample, failing job: {r.stdout!r}")
    py = os.path.join(os.environ.get("SPINDLE_SOURCE_ROOT", "."), "samples", "python", "client.py")
    # spn_client_waiting: on a gateway without workers the samples say why the
    # job waits, then follow it once a worker has come
    p2, ep2 = start_serve(tmp, "--workers", "0", db="q2.db", log="serve2.log")
    s = subprocess.Popen([SAMPLE_C, ep2, "copy", f"in={tmp}/in.bin", f"out={tmp}/c2.bin"], stdout=subprocess.PIPE)
    PROCS.append(s)
    wait_for(lambda: cli("status", "1", "--connect", ep2).returncode == 0, 10, "the C sample's job")
    sp = subprocess.Popen([sys.executable, py, "--connect", ep2, "submit", "copy", "--input", f"in={tmp}/in.bin",
                           "--output", f"out={tmp}/py2.bin", "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    PROCS.append(sp)
    wait_for(lambda: cli("status", "2", "--connect", ep2).returncode == 0, 10, "the Python sample's job")
    # the worker comes once the Python sample has said why its job waits (the
    # C sample, whose stdout a pipe buffers, submitted well before)
    early = read_until(sp.stderr, b"job 2 waiting", 20)
    start_worker(tmp, ep2, "--slots", "1")
    pout, perr = sp.communicate(timeout=30)
    perr = early + perr
    check(sp.returncode == 0 and b'job 2 waiting: no worker that runs pipeline "copy" has been seen' in perr
          and pout.split() == [b"2", b"2", b"succeeded"], f"the Python sample: {pout!r} {perr!r}")
    out, _ = s.communicate(timeout=30)
    lines = out.decode().splitlines()
    check(s.returncode == 0 and len(lines) >= 3 and lines[0] == "submitted job 1"
          and lines[1].startswith('job 1 waiting: no worker that runs pipeline "copy" has been seen')
          and lines[-1].startswith("job 1 finished: succeeded") and sum("waiting" in l for l in lines) == 1,
          f"the C sample on a gateway that has no worker until later: {lines}")
    py = os.path.join(os.environ.get("SPINDLE_SOURCE_ROOT", "."), "samples", "python", "client.py")
    r = subprocess.run([sys.executable, py, "--connect", ep, "submit", "copy", "--input", f"in={tmp}/in.bin",
                        "--output", f"out={tmp}/py.bin", "--param", "chunk_delay_ms=20", "--wait"],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, f"samples/python/client.py: {r.returncode} {r.stderr!r}")
    check(b"running" in r.stderr and b"succeeded" in r.stdout, f"python progress: {r.stderr!r}")
    check(same(f"{tmp}/in.bin", f"{tmp}/py.bin"), "Python sample output")
    r = subprocess.run([sys.executable, py, "--connect", ep, "submit", "copy", "--input", "in=/etc/passwd",
                        "--output", f"out={tmp}/x"], capture_output=True, timeout=60)
    check(r.returncode == 5 and b"forbidden_path" in r.stderr, f"python refusal: {r.stderr!r}")
    r = subprocess.run([sys.executable, py, "--connect", ep, "submit", "copy", "--input", f"in={tmp}/in.bin",
                        "--input", f"in={tmp}/py.bin", "--output", f"out={tmp}/y"], capture_output=True, timeout=60)
    check(r.returncode == 2 and b"in is given twice" in r.stderr, f"python, one name twice: {r.stderr!r}")


def http_get(port, path, raw=None):
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=5) as so:
        so.sendall(raw if raw is not None else f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while True:
            d = so.recv(4096)
            if not d:
                break
            data += d
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def case_http(tmp):
    port = free_port()
    p, ep = start_serve(tmp, "--workers", "0", "--http", f"127.0.0.1:{port}")
    check(http_get(port, "/healthz") == (200, "ok\n"), "healthz")
    check(http_get(port, "/readyz") == (200, "ready\n"), "readyz")
    check(http_get(port, "/nope")[0] == 404, "404")
    check(http_get(port, None, raw=b"BREW /coffee\r\n\r\n")[0] == 400, "400")
    check(http_get(port, None, raw=b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                  b"Connection: close\r\n\r\nhi")[0] == 405, "POST: 405")
    # HTTP/1.1 keep-alive: several requests on one connection (as Prometheus scrapes)
    import http.client
    hc = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for path, want in [("/healthz", 200), ("/readyz", 200), ("/nope", 404), ("/healthz", 200)]:
        hc.request("GET", path)
        r = hc.getresponse()
        r.read()
        check(r.status == want, f"keep-alive GET {path}: {r.status}")
    hc.request("HEAD", "/healthz")
    r = hc.getresponse()
    check(r.status == 200 and r.read() == b"", f"HEAD: {r.status}")
    hc.close()
    # a request trickled in byte by byte, while another client is served
    import socket
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    slow.sendall(b"GET /hea")
    check(http_get(port, "/healthz") == (200, "ok\n"), "served while a slow client is half-way")
    slow.sendall(b"lthz HTTP/1.0\r\n\r\n")
    data = b""
    while (d := slow.recv(4096)):
        data += d
    slow.close()
    check(data.startswith(b"HTTP/1.") and data.endswith(b"ok\n"), f"slow client: {data!r}")
    for _ in range(3):
        cli("submit", "noop", "--connect", ep, check_rc=0)
    code, body = http_get(port, "/metrics")
    check(code == 200 and 'spindle_jobs{state="queued"} 3' in body, f"metrics: {body}")
    check('spindle_workers{kind="remote"} 0' in body, body)
    w = start_worker(tmp, ep, name="m1")
    wait_for(lambda: 'spindle_jobs{state="succeeded"} 3' in http_get(port, "/metrics")[1], 20,
             "the remote worker to run the queued jobs")
    check('spindle_workers{kind="remote"} 1' in http_get(port, "/metrics")[1], "worker counted")
    # a client that connects and never sends must not keep the gateway from stopping
    idle = socket.create_connection(("127.0.0.1", port))
    check(http_get(port, "/healthz")[0] == 200, "served while another connection idles")
    p.send_signal(signal.SIGTERM)
    check(p.wait(10) == 0, "gateway did not stop cleanly with an idle HTTP connection")
    idle.close()


def case_worker_reconnect(tmp):
    """A remote worker keeps its running job across a gateway kill -9 and restart,
    and gets new jobs from the restarted gateway."""
    log = f"{tmp}/exec.log"
    args = ["--workers", "0", "--lease-ms", "4000", "--heartbeat-ms", "300"]
    p, ep = start_serve(tmp, *args)
    w = start_worker(tmp, ep, "--chunk-bytes", "8192", "--heartbeat-ms", "300", "--exec-log", log,
                     name="wr")
    make_file(f"{tmp}/in.bin", 160_000, 11)  # 20 chunks
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/a.bin",
            "--param", "chunk_delay_ms=100", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 3, 20, "the job to run on the worker")
    p.send_signal(signal.SIGKILL)
    p.wait()
    port = ep.rsplit(":", 1)[1]
    p2, ep2 = start_serve(tmp, *args, bind=f"tcp://127.0.0.1:{port}")
    cli("watch", str(jid), "--connect", ep2, timeout=60, check_rc=0)
    st = status(ep2, jid)
    check(st["attempts"] == 1 and st["errors"] == [], f"the job should finish in its first attempt: {st}")
    check(same(f"{tmp}/in.bin", f"{tmp}/a.bin"), "output")
    # the worker re-granted its credit to the new gateway instance
    cli("submit", "noop", "--wait", "--connect", ep2, timeout=30, check_rc=0)
    check(w.poll() is None, "worker exited")


def case_worker_zombie(tmp):
    """A worker frozen (SIGSTOP) past 3 heartbeats is declared dead and its job
    runs elsewhere; when it wakes up it is told to stop and never completes
    the job it lost: one completion, one output."""
    p, ep = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "200", "--lease-ms", "2000",
                        "--backoff-ms", "50")
    log = f"{tmp}/exec.log"
    ws = {n: start_worker(tmp, ep, "--chunk-bytes", "4096", "--heartbeat-ms", "200", "--exec-log", log,
                          name=n) for n in ("za", "zb")}
    os.mkdir(f"{tmp}/out")
    make_file(f"{tmp}/in.bin", 160_000, 13)  # 40 chunks
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out/o.bin",
            "--param", "chunk_delay_ms=50", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    st = wait_for(lambda: (lambda s: s if s["state"] == "running" and s["done"] >= 3 else None)(status(ep, jid)),
                  20, "the job to run")
    frozen = st["worker"].split(":", 1)[1]
    ws[frozen].send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: (lambda s: s["attempts"] == 2 and s["state"] == "running")(status(ep, jid)), 20,
                 "the job to move to the other worker")
    finally:
        ws[frozen].send_signal(signal.SIGCONT)
    cli("watch", str(jid), "--connect", ep, timeout=60, check_rc=0)
    time.sleep(0.5)  # give the woken worker time to (wrongly) finish, if it would
    done = [l for l in open(log).read().splitlines() if l.startswith(f"done {jid} ")]
    check(done == [f"done {jid} 2"], f"completions: {done}; {status(ep, jid)}; log: {open(log).read()}")
    check(same(f"{tmp}/in.bin", f"{tmp}/out/o.bin"), "output")
    check(os.listdir(f"{tmp}/out") == ["o.bin"], f"exactly one output: {os.listdir(f'{tmp}/out')}")
    check(ws[frozen].poll() is None, "the woken worker exited")


def case_graceful_restart(tmp):
    """With drain_grace_s = 0, SIGTERM stops the gateway promptly even mid-job;
    the interrupted job is queued again without losing an attempt and
    completes after the restart."""
    args = ["--workers", "1", "--chunk-bytes", "4096", "--max-attempts", "1", "--drain-grace-s", "0"]
    p, ep = start_serve(tmp, *args)
    make_file(f"{tmp}/in.bin", 200_000, 21)  # 49 chunks
    jid = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/o.bin",
                  "--param", "chunk_delay_ms=50", "--connect", ep, check_rc=0).stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 3, 20, "the job to run")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    check(p.wait(10) == 0, f"gateway exit {p.returncode}")
    check(time.monotonic() - t0 < 2, "the gateway waited for the job instead of stopping it")
    check(not os.path.exists(f"{tmp}/o.bin") and stray_files(tmp) == [], "partial output left")
    port = ep.rsplit(":", 1)[1]
    p2, ep2 = start_serve(tmp, *args, bind=f"tcp://127.0.0.1:{port}")
    cli("watch", str(jid), "--connect", ep2, timeout=60, check_rc=0)
    st = status(ep2, jid)
    check(st["attempts"] == 1 and st["errors"] == [], f"a shutdown cost an attempt: {st}")
    check(same(f"{tmp}/in.bin", f"{tmp}/o.bin"), "output")


# ------------------------------------------------- real pipelines (runtime)

SRC = os.path.abspath(os.environ.get("SPINDLE_SOURCE_ROOT", "."))
SYN_W, SYN_H, SYN_C = 64, 48, 3  # configs/synthetic-job.toml


def synth_expected(job_id, frames, w=SYN_W, h=SYN_H, c=SYN_C):
    """The bytes `filesink` must write for a job: every frame of the synth
    pattern (stages/util/pattern.h), computed here independently."""
    import numpy as np
    y, x, ch = np.meshgrid(np.arange(h, dtype=np.uint64), np.arange(w, dtype=np.uint64),
                           np.arange(c, dtype=np.uint64), indexing="ij")
    base = y * np.uint64(3) + x + ch * np.uint64(85)
    out = []
    for seq in range(frames):
        v = base + np.uint64(job_id * 131 + seq * 7)
        out.append(((v ^ (v >> np.uint64(8))) & np.uint64(0xFF)).astype(np.uint8).tobytes())
    return b"".join(out)


def pipeline_config(tmp):
    """A server config with the repository's synthetic pipeline, a slow one
    (20 ms a frame, slept: the stand-in for a slow model takes no CPU from
    the tests beside it) and one whose sink checks a per-job count."""
    with open(f"{tmp}/slow.toml", "w") as f:
        f.write('[pipeline]\nname = "slow"\n[pipeline.outputs]\nframes = "sink.path"\n'
                '[pipeline.params]\nframes = "source.frames"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\nframes = 100\nwidth = 64\nheight = 48\n'
                '[[stage]]\nname = "work"\nkind = "cost"\ninputs = ["source"]\nus = 20000\nsleep = true\n'
                '[[stage]]\nname = "sink"\nkind = "filesink"\ninputs = ["work"]\n')
    with open(f"{tmp}/checked.toml", "w") as f:
        f.write('[pipeline]\nname = "checked"\n[pipeline.params]\nframes = "source.frames"\n'
                'expect = "sink.expect_frames"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\nframes = 10\nwidth = 8\nheight = 8\n'
                '[[stage]]\nname = "sink"\nkind = "check"\ninputs = ["source"]\nexpect_frames = 10\n'
                'verify_pattern = true\n')
    with open(f"{tmp}/two.toml", "w") as f:
        f.write('[pipeline]\nname = "two"\n[pipeline.outputs]\nfirst = "a.path"\nsecond = "b.path"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\nframes = 3\nwidth = 8\nheight = 8\n'
                '[[stage]]\nname = "split"\nkind = "tee"\ninputs = ["source"]\n'
                '[[stage]]\nname = "a"\nkind = "filesink"\ninputs = ["split.out0"]\n'
                '[[stage]]\nname = "b"\nkind = "filesink"\ninputs = ["split.out1"]\n')
    with open(f"{tmp}/srv.toml", "w") as f:
        f.write('[server]\ndevices = "cpu"\n'
                f'[[pipeline]]\nname = "synthetic"\nconfig = "{SRC}/configs/synthetic-job.toml"\n'
                '[[pipeline]]\nname = "slow"\nconfig = "slow.toml"\n'
                '[[pipeline]]\nname = "checked"\nconfig = "checked.toml"\n'
                '[[pipeline]]\nname = "two"\nconfig = "two.toml"\n')
    return f"{tmp}/srv.toml"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def case_pipeline(tmp):
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "2", "--max-attempts", "1")
    os.mkdir(f"{tmp}/out")
    # submit → wait → result file, through the real runtime
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/a.raw", "--param", "frames=37", "--wait",
            "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    check(read(f"{tmp}/out/a.raw") == synth_expected(jid, 37), "output bytes differ from the synth pattern")
    # two outputs of one job on one file: refused at SUBMIT naming both; apart, both are written
    two = cli("submit", "two", "--output", f"first={tmp}/out/t.raw", "--output", f"second={tmp}/out/../out/t.raw",
              "--connect", ep, check_rc=5)
    check(b"invalid" in two.stderr and b"outputs.first and outputs.second are one file" in two.stderr, two.stderr)
    cli("submit", "two", "--output", f"first={tmp}/out/t1.raw", "--output", f"second={tmp}/out/t2.raw", "--wait",
        "--connect", ep, check_rc=0)
    check(read(f"{tmp}/out/t1.raw") == read(f"{tmp}/out/t2.raw") != b"", "the two outputs of a tee differ")
    st = status(ep, jid)
    check(st["state"] == "succeeded" and st["done"] == st["total"] == 37, f"progress recorded: {st}")
    # done in well under 0.2 s: no rate to show yet, and no made-up "0.0 fps"
    # (the slow job below shows its rate)
    check(b"37/37 frames" in r.stderr and b"0.0 fps" not in r.stderr, f"submit --wait: {r.stderr!r}")
    # the pipeline's default frame count when the job sets none
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/d.raw", "--wait", "--connect", ep, check_rc=0)
    check(read(f"{tmp}/out/d.raw") == synth_expected(int(r.stdout.split()[0]), 120), "default frame count")
    # progress events while it runs: 100 frames at 20 ms (2 s; plain lines
    # come at most once a second), done/total and fps
    r = cli("submit", "slow", "--output", f"frames={tmp}/out/s.raw", "--param", "frames=100", "--wait",
            "--connect", ep, check_rc=0)
    import re
    prog = [(int(a), int(b), float(c)) for a, b, c in
            re.findall(rb"running (\d+)/(\d+) frames ([0-9.]+) fps", r.stderr)]
    check(len(prog) >= 2 and all(t == 100 for _, t, _ in prog), f"progress lines: {r.stderr!r}")
    check(any(d < 100 for d, _, _ in prog) and prog[-1][0] == 100, f"progress during the run: {prog}")
    check(all(x[0] <= y[0] for x, y in zip(prog, prog[1:])), f"progress went back: {prog}")
    check(0 < prog[-1][2] <= 60, f"fps of a 20 ms/frame pipeline (at most 50): {prog}")
    check(len(read(f"{tmp}/out/s.raw")) == 100 * SYN_W * SYN_H * SYN_C, "slow pipeline output size")
    # bad per-job params are refused with a message naming what is wrong
    bad = [(["--param", "frames=lots"], b'key "frames" must be an integer'),
           (["--param", "source.nope=1"], b'unknown key "nope"'),
           (["--param", "source.width=8"], b'"width" is set per pipeline, not per job'),
           (["--param", "speed=2"], b'has no param "speed"'),
           (["--param", "frames=-3"], b"frames"),
           ([], b'needs output "frames"')]
    for args, msg in bad:
        outs = ["--output", f"frames={tmp}/out/bad.raw"] if args else []
        r = cli("submit", "synthetic", *outs, *args, "--connect", ep, check_rc=5)
        check(msg in r.stderr and b"invalid" in r.stderr, f"{args}: {r.stderr!r}")
    r = cli("submit", "synthetic", "--output", f"video={tmp}/out/bad.raw", "--connect", ep, check_rc=5)
    check(b'has no output "video" (its outputs: frames)' in r.stderr, f"unknown output: {r.stderr!r}")
    check(not os.path.exists(f"{tmp}/out/bad.raw"), "a refused job wrote")
    # a job that fails in the runtime: the message names the stage and job
    r = cli("submit", "checked", "--param", "frames=5", "--param", "expect=6", "--wait", "--connect", ep,
            check_rc=1)
    jid = int(r.stdout.split()[0])
    st = status(ep, jid)
    check(st["state"] == "failed" and st["attempts"] == 1, f"failed job: {st}")
    err = st["errors"][0]["error"]
    check('stage "sink"' in err and f"job {jid}" in err and '"checked"' in err and "expected 6" in err,
          f"runtime failure: {err}")
    # the server stays up and runs the next job
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/b.raw", "--param", "frames=3", "--wait",
            "--connect", ep, check_rc=0)
    check(read(f"{tmp}/out/b.raw") == synth_expected(int(r.stdout.split()[0]), 3), "job after the failures")
    r = cli("submit", "checked", "--param", "frames=4", "--param", "expect=4", "--wait", "--connect", ep,
            check_rc=0)
    check(stray_files(f"{tmp}/out") == [], f"temporary files left: {stray_files(f'{tmp}/out')}")
    check(p.poll() is None, "gateway died")


def case_pipeline_cancel(tmp):
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "1")
    os.mkdir(f"{tmp}/out")
    r = cli("submit", "slow", "--output", f"frames={tmp}/out/c.raw", "--param", "frames=400",
            "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 5, 20, "the job to make progress")
    t0 = time.monotonic()
    cli("cancel", str(jid), "--connect", ep, check_rc=0)
    w = cli("watch", str(jid), "--connect", ep, check_rc=3)
    check(time.monotonic() - t0 < 5, "cancel took too long")
    check(b"cancelled" in w.stdout, f"watch after cancel: {w.stdout!r}")
    st = status(ep, jid)
    check(st["done"] < 400, f"cancel did not stop the job early: {st['done']}/400")
    check(os.listdir(f"{tmp}/out") == [], f"cancelled job left files: {os.listdir(f'{tmp}/out')}")
    # the same worker runs the next job
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/n.raw", "--param", "frames=4", "--wait",
            "--connect", ep, check_rc=0)
    check(read(f"{tmp}/out/n.raw") == synth_expected(int(r.stdout.split()[0]), 4), "job after the cancel")


def case_pipeline_hundred(tmp):
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "2")
    os.mkdir(f"{tmp}/out")
    n = 100
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    for i in range(n):
        c.req("SUBMIT", {"req": i + 1, "pipeline": "synthetic", "outputs": {"frames": f"{tmp}/out/{i}.raw"},
                         "params": {"frames": i % 7 + 1}})
    ids = {}
    while len(ids) < n:
        m = c.recv(20000)
        check(m is not None, f"only {len(ids)} of {n} submissions acknowledged")
        check(m[0] == "SUBMITTED", f"submit refused: {m}")
        ids[m[1]["req"] - 1] = m[1]["id"]

    def all_done():
        c.req("LIST", {"req": 10**6, "limit": 1000})
        while True:
            m = c.recv(5000)
            check(m is not None, "LIST unanswered")
            if m[1].get("req") == 10**6:
                states = [j["state"] for j in m[1]["jobs"]]
                check(all(s in ("queued", "running", "succeeded") for s in states), f"states {states}")
                return states.count("succeeded") == n
    wait_for(all_done, 120, f"{n} jobs to succeed")
    for i in range(n):
        check(read(f"{tmp}/out/{i}.raw") == synth_expected(ids[i], i % 7 + 1), f"output {i} differs")
    check(stray_files(f"{tmp}/out") == [], "temporary files left")
    c.close()
    ctx.term()


def case_pipeline_worker_kill(tmp):
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "0", "--heartbeat-ms", "200", "--lease-ms", "2000",
                        "--backoff-ms", "50")
    ws = {name: start_worker(tmp, ep, "--config", cfg, "--heartbeat-ms", "200", name=name)
          for name in ("wa", "wb")}
    os.mkdir(f"{tmp}/out")
    # a remote worker runs a real pipeline on its own runtime
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/ref.raw", "--param", "frames=9", "--wait",
            "--connect", ep, check_rc=0)
    check(read(f"{tmp}/out/ref.raw") == synth_expected(int(r.stdout.split()[0]), 9), "remote worker output")
    # 150 frames at 20 ms: 3 s of work, killed after 20 frames
    r = cli("submit", "slow", "--output", f"frames={tmp}/out/victim.raw", "--param", "frames=150",
            "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    st = wait_for(lambda: (lambda s: s if s["state"] == "running" and s["done"] >= 20 else None)(status(ep, jid)),
                  30, "the job to run on a worker")
    owner = st["worker"].split(":", 1)[1]
    check(owner in ws, f"unexpected owner {st['worker']}")
    ws[owner].send_signal(signal.SIGKILL)
    ws[owner].wait()
    cli("watch", str(jid), "--connect", ep, timeout=60, check_rc=0)
    st = status(ep, jid)
    check(st["attempts"] == 2 and "lost" in st["errors"][0]["error"], f"job should have run twice: {st}")
    check(read(f"{tmp}/out/victim.raw") == synth_expected(jid, 150), "output differs from the undisturbed bytes")
    check(sorted(os.listdir(f"{tmp}/out")) == ["ref.raw", "victim.raw"],
          f"exactly one output expected: {os.listdir(f'{tmp}/out')}")
    other = [n for n in ws if n != owner][0]
    check(ws[other].poll() is None, "the surviving worker exited")


XFER_FRAME = 8 * 4 * 3  # synth at 8x4 RGB: 96 bytes a frame


def xfer_config(tmp):
    """A pipeline whose copies are known to the byte: synth (host memory) ->
    cost (20 ms a frame, so two jobs overlap even where a loaded machine is
    slow to start the second `spindle submit`) -> upload on emulated device
    cpu:1 (the test stage of tests/runtime/xfer: per frame it copies the
    96-byte frame to the device and 32 bytes back itself, plus 8 bytes host
    to host for no job) -> filesink (host memory: the runtime copies each
    device frame back on the edge)."""
    with open(f"{tmp}/xfer.toml", "w") as f:
        f.write('[pipeline]\nname = "xfer"\n[pipeline.outputs]\nframes = "sink.path"\n'
                '[pipeline.params]\nframes = "source.frames"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\nframes = 10\nwidth = 8\nheight = 4\n'
                '[[stage]]\nname = "work"\nkind = "cost"\ninputs = ["source"]\nus = 20000\nsleep = true\n'
                '[[stage]]\nname = "up"\nkind = "upload"\ninputs = ["work"]\ndevice = "cpu:1"\n'
                'back = 32\nuntagged = 8\n'
                '[[stage]]\nname = "sink"\nkind = "filesink"\ninputs = ["up"]\n')
    with open(f"{tmp}/xsrv.toml", "w") as f:
        f.write('[server]\ndevices = "cpu:2"\n[[pipeline]]\nname = "xfer"\nconfig = "xfer.toml"\n')
    return f"{tmp}/xsrv.toml"


def check_transfers(st, frames):
    """A job's status carries exactly its own frames' copies: the stage's
    upload and download, the edge's copy back; nothing of the other job and
    nothing of the job-less host copies."""
    t = st.get("transfers")
    check(t is not None, f"no transfers in the status: {st}")
    got = {k: t[k]["bytes"] for k in ("h2d", "d2h", "d2d", "h2h")}
    want = {"h2d": XFER_FRAME * frames, "d2h": (32 + XFER_FRAME) * frames, "d2d": 0, "h2h": 0}
    check(got == want, f"job {st['id']} ({frames} frames): transfers {got}, want {want}")
    check(all(t[k]["ms"] >= 0 for k in want), f"transfer times: {t}")
    check(t.get("bytes_per_frame") == 2 * XFER_FRAME + 32, f"bytes per frame: {t}")


def xfer_pair(tmp, ep, outdir, n1, n2):
    """Two xfer jobs submitted together; both must succeed, overlapping."""
    ids = []
    for i, n in enumerate((n1, n2)):
        r = cli("submit", "xfer", "--output", f"frames={outdir}/{i}.raw", "--param", f"frames={n}",
                "--connect", ep, check_rc=0)
        ids.append(int(r.stdout.split()[0]))
    wait_all(ep, ids, 60)
    sts = [status(ep, j) for j in ids]
    for st, n, i in zip(sts, (n1, n2), range(2)):
        check(read(f"{outdir}/{i}.raw") == synth_expected(st["id"], n, 8, 4, 3), f"job {st['id']} output")
        check_transfers(st, n)
    a, b = (s["times"] for s in sts)
    check(a["running"] < b["succeeded"] and b["running"] < a["succeeded"],
          f"the two jobs did not run at the same time: {a} {b}")
    return ids


def case_pipeline_transfers(tmp):
    """Per-job transfers in `spindle status`, edges and stages together, for
    two jobs at once: run by the gateway's own slots, then by a remote
    worker (on Redis: a worker leasing from the queue), and still there
    after the gateway restarts."""
    xfer = os.environ.get("SPINDLE_XFER_PLUGIN_DIR")
    check(xfer, "SPINDLE_XFER_PLUGIN_DIR is not set (the upload test stage)")
    cfg = xfer_config(tmp)
    for d in ("out1", "out2"):
        os.mkdir(f"{tmp}/{d}")
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "2", "--plugin-path", xfer)
    first = xfer_pair(tmp, ep, f"{tmp}/out1", 40, 60)
    p.send_signal(signal.SIGINT)
    check(p.wait(20) == 0, f"gateway exit {p.returncode}")
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "0", "--plugin-path", xfer, log="serve2.log")
    for j, n in zip(first, (40, 60)):
        check_transfers(status(ep, j), n)  # stored with the job
    where = REDIS["url"] if BACKEND == "redis" else ep
    start_worker(tmp, where, "--config", cfg, "--plugin-path", xfer, "--slots", "2", name="xw")
    xfer_pair(tmp, ep, f"{tmp}/out2", 50, 30)


def case_worker_transfers(tmp):
    """A worker's DONE carries the attempt's transfers and warnings: the
    gateway stores the transfers exactly and the warnings as far as they fit
    in 2 KiB (then a line counting the rest); malformed ones (transfers:
    negative, fractional bytes, not an object; warnings: not an array of
    strings) count as none, the job still succeeds and the gateway says why."""
    p, ep = start_serve(tmp, "--workers", "0")
    ctx = zmq.Context()
    w = Raw(ctx, ep)
    bad = [{"h2d": {"bytes": -5}}, {"d2h": {"bytes": 1.5}}, {"d2d": 7}, "lots"]
    ids = [int(cli("submit", "noop", "--connect", ep, check_rc=0).stdout.split()[0]) for _ in range(1 + len(bad))]
    w.req("LEASE", {"worker": "rw", "credit": len(ids)})
    jobs = {}
    while len(jobs) < len(ids):
        m = w.recv(10000)
        check(m is not None, f"only {len(jobs)} of {len(ids)} jobs handed to the raw worker")
        if m[0] == "JOB":
            jobs[m[1]["id"]] = m[1]["attempt"]
    good = {"h2d": {"bytes": 1000, "ms": 0.5}, "d2h": {"bytes": 24, "ms": 0.25}}
    many = [f'decode: line {i} "quoted" \u00e9 ' + "x" * 80 for i in range(40)]
    bad_wn = ["decode: one string", ["decode: ok", 7], {"decode": "x"}, [["decode: nested"]]]
    for jid, xf, wn in zip(ids, [good] + bad, [many] + bad_wn):
        w.req("DONE", {"worker": "rw", "id": jid, "attempt": jobs[jid], "compute_s": 0.1, "gpu_s": 0,
                       "transfers": xf, "warnings": wn})
    for jid in ids:
        wait_for(lambda: status(ep, jid)["state"] == "succeeded", 10, f"job {jid} to succeed")
    t = status(ep, ids[0])["transfers"]
    check({k: (t[k]["bytes"], t[k]["ms"]) for k in ("h2d", "d2h", "d2d", "h2h")} ==
          {"h2d": (1000, 0.5), "d2h": (24, 0.25), "d2d": (0, 0), "h2h": (0, 0)}, f"stored transfers: {t}")
    check(t["bytes_per_frame"] == 1024, f"bytes per frame of a 1-unit job: {t}")
    for jid in ids[1:]:
        t = status(ep, jid)["transfers"]
        check(all(t[k]["bytes"] == 0 and t[k]["ms"] == 0 for k in ("h2d", "d2h", "d2d", "h2h")),
              f"job {jid}: malformed transfers were recorded: {t}")
    log = open(f"{tmp}/serve.log", errors="replace").read()
    check(log.count("recorded as no transfers") == len(bad), f"warnings for malformed transfers: {log[-2000:]}")
    # the warnings: the first lines whole and in order, then the count of the rest
    got = status(ep, ids[0]).get("warnings", [])
    k = len(got) - 1
    check(5 < k < 40 and got[:k] == many[:k] and got[k] == f"... {40 - k} more warnings: see the worker's log"
          and len(json.dumps(got, separators=(",", ":"))) < 2048, f"stored warnings: {got}")
    for jid in ids[1:]:
        check("warnings" not in status(ep, jid), f"job {jid}: malformed warnings were recorded")
    check(log.count('"warnings\\" is not an array of strings; recorded as none') == len(bad_wn),
          f"warnings for malformed warnings: {log[-2000:]}")
    w.close()
    ctx.term()


CASE_OK = {}
# ------------------------------------------- drain, shared queue, faults

def exec_counts(log, kind="done"):
    counts = {}
    if os.path.exists(log):
        for l in open(log).read().splitlines():
            f = l.split()
            if f and f[0] == kind:
                counts[int(f[1])] = counts.get(int(f[1]), 0) + 1
    return counts


def check_exactly_once(tmp, log, ids, outdir, ref, may_repeat=()):
    """Every job succeeded, its runner finished once (twice for a job of
    may_repeat), each output equals the reference, and no temporary or
    marker file is left."""
    dones = exec_counts(log)
    missing = sorted(set(ids) - set(dones))
    # A job whose earlier attempt had published before its lease was lost
    # succeeds without running again: it has no second "done" line, and may
    # have none in this log only if the runner never finished: not allowed.
    check(not missing, f"jobs whose runner never finished: {missing[:10]}")
    twice = sorted(j for j, k in dones.items() if k != 1 and not (k == 2 and j in may_repeat))
    check(not twice, f"jobs run to completion more than once: {twice}")
    for f in os.listdir(outdir):
        if f.startswith("."):
            continue
        check(same(ref, os.path.join(outdir, f)), f"output {f} differs")
    # A marker whose removal a killed process never confirmed is removed
    # by a later sweep (one lease time).
    wait_for(lambda: stray_files(outdir) == [], 10,
             f"temporary or marker files to go: {stray_files(outdir)}")


def wait_all(ep, ids, timeout, what="all jobs to succeed"):
    def done():
        r = cli("jobs", "--state", "succeeded", "--limit", "1000", "--connect", ep, check_rc=None)
        if r.returncode != 0:
            return False
        got = {int(l.split()[0]) for l in r.stdout.decode().splitlines()[1:] if l.strip()}
        return set(ids) <= got
    wait_for(done, timeout, what)


def submit_many(ep, tmp, n, delay_ms, outdir, **extra):
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    for i in range(n):
        b = {"req": i + 1, "pipeline": "copy", "inputs": {"in": f"{tmp}/in.bin"},
             "outputs": {"out": f"{outdir}/{i}.bin"}, "params": {"chunk_delay_ms": delay_ms}}
        b.update({k: (v(i) if callable(v) else v) for k, v in extra.items()})
        c.req("SUBMIT", b)
    ids = [None] * n  # ids[i]: the job writing {outdir}/{i}.bin
    for _ in range(n):
        m = c.recv(20000)
        check(m and m[0] == "SUBMITTED", f"submit: {m}")
        ids[m[1]["req"] - 1] = m[1]["id"]
    c.close()
    ctx.term()
    return ids


def case_drain(tmp):
    """SIGTERM drains the gateway: /readyz answers 503 while the HTTP port
    stays open, no new job starts, the running one finishes, exit 0."""
    port = free_port()
    log = f"{tmp}/exec.log"
    p, ep = start_serve(tmp, "--workers", "1", "--http", f"127.0.0.1:{port}", "--chunk-bytes", "8192",
                        "--drain-grace-s", "20", "--exec-log", log)
    make_file(f"{tmp}/in.bin", 160_000, 31)  # 20 chunks
    a = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/a.bin",
                "--param", "chunk_delay_ms=300", "--connect", ep, check_rc=0).stdout.split()[0])  # 6 s
    b = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/b.bin",
                "--connect", ep, check_rc=0).stdout.split()[0])
    wait_for(lambda: status(ep, a)["done"] >= 2, 20, "the job to run")
    check(http_get(port, "/readyz")[0] == 200, "ready before SIGTERM")
    p.send_signal(signal.SIGTERM)
    wait_for(lambda: http_get(port, "/readyz") == (503, "stopping\n"), 5, "/readyz to answer 503")
    # (a raw request: a client process may start too slowly under ASan)
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    c.req("STATUS", {"req": 1, "id": a})
    m = c.recv(5000)
    c.close()
    ctx.term()
    check(m and m[0] == "STATUS" and m[1]["state"] == "running",
          f"the running job was stopped instead of drained: {m}")
    check(p.wait(20) == 0, f"gateway exit {p.returncode}")
    check(same(f"{tmp}/in.bin", f"{tmp}/a.bin"), "the drained job's output")
    check(not os.path.exists(f"{tmp}/b.bin") and stray_files(tmp) == [], "a queued job started while draining")
    p2, ep2 = start_serve(tmp, "--workers", "1", "--chunk-bytes", "8192", "--exec-log", log)
    st = status(ep2, a)
    check(st["state"] == "succeeded" and st["attempts"] == 1 and st["done"] == st["total"] == 20, f"{st}")
    cli("watch", str(b), "--connect", ep2, timeout=30, check_rc=0)
    # grace too short: the job goes back to the queue, attempt not counted
    c = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/c.bin",
                "--param", "chunk_delay_ms=100", "--connect", ep2, check_rc=0).stdout.split()[0])
    wait_for(lambda: status(ep2, c)["done"] >= 2, 20, "the job to run")
    p2.send_signal(signal.SIGINT)
    check(p2.wait(10) == 0, f"gateway exit {p2.returncode}")
    check(not os.path.exists(f"{tmp}/c.bin") and stray_files(tmp) == [], "partial output left")
    p3, ep3 = start_serve(tmp, "--workers", "1", "--chunk-bytes", "8192", "--exec-log", log)
    cli("watch", str(c), "--connect", ep3, timeout=60, check_rc=0)
    st = status(ep3, c)
    check(st["attempts"] == 1 and st["errors"] == [], f"a stop cost an attempt: {st}")
    check(exec_counts(log) == {a: 1, b: 1, c: 1}, f"completions: {exec_counts(log)}")


def case_worker_drain(tmp):
    """SIGTERM of a busy remote worker: it gets no new job, its running jobs
    finish, it exits 0; with the grace over, its job goes back to the queue
    without costing an attempt and runs elsewhere. No partial output."""
    log = f"{tmp}/exec.log"
    p, ep = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "200", "--lease-ms", "2000")
    make_file(f"{tmp}/in.bin", 80_000, 51)  # 20 chunks of 4 KiB
    w1 = start_worker(tmp, ep, "--slots", "2", "--chunk-bytes", "4096", "--heartbeat-ms", "200",
                      "--exec-log", log, name="d1")
    os.mkdir(f"{tmp}/out")
    ids = submit_many(ep, tmp, 6, 100, f"{tmp}/out")  # 2 s each
    wait_for(lambda: len(exec_counts(log, "start")) == 2, 20, "the worker to start two jobs")
    first = sorted(exec_counts(log, "start"))
    w1.send_signal(signal.SIGTERM)
    check(w1.wait(30) == 0, f"draining worker exit {w1.returncode}")
    check(sorted(exec_counts(log)) == first, f"drained worker ran {exec_counts(log)}, want {first} only")
    for j in first:
        st = status(ep, j)
        check(st["state"] == "succeeded" and st["attempts"] == 1, f"drained job {st}")
    # grace over: the job goes back without losing an attempt
    w2 = start_worker(tmp, ep, "--slots", "1", "--chunk-bytes", "4096", "--heartbeat-ms", "200",
                      "--drain-grace-s", "1", "--exec-log", log, name="d2")
    wait_for(lambda: len(exec_counts(log, "start")) == 3, 20, "the next job to start")
    third = [j for j in exec_counts(log, "start") if j not in first][0]
    w2.send_signal(signal.SIGTERM)
    check(w2.wait(20) == 0, f"worker exit {w2.returncode}")
    st = wait_for(lambda: (lambda s: s if s["state"] == "queued" else None)(status(ep, third)), 10,
                  "the released job to be queued again")
    check(st["attempts"] == 0 and st["errors"] == [], f"a drain cost an attempt: {st}")
    w3 = start_worker(tmp, ep, "--slots", "2", "--chunk-bytes", "4096", "--exec-log", log, name="d3")
    wait_all(ep, ids, 60)
    check_exactly_once(tmp, log, ids, f"{tmp}/out", f"{tmp}/in.bin")
    check(status(ep, third)["attempts"] == 1, "the released job ran as attempt 1")


def case_queue_workers(tmp):
    """Redis only: stateless workers lease straight from the queue.
    Priorities order the work; kill -9 of a busy worker loses nothing;
    SIGTERM of a busy worker lets its jobs finish; each job runs to
    completion once."""
    check(BACKEND == "redis", "this case needs --backend redis")
    log = f"{tmp}/exec.log"
    p, ep = start_serve(tmp, "--workers", "0", "--lease-ms", "1000", "--backoff-ms", "50")
    url = REDIS["url"]
    make_file(f"{tmp}/in.bin", 40_000, 41)  # 10 chunks of 4 KiB
    for d in ("lo", "hi", "mid"):
        os.makedirs(f"{tmp}/prio/{d}")
    # priorities: queued before any worker runs; one slot runs them in order
    lo = submit_many(ep, tmp, 5, 0, f"{tmp}/prio/lo", priority=-3)
    hi = submit_many(ep, tmp, 5, 0, f"{tmp}/prio/hi", priority=7)
    mid = submit_many(ep, tmp, 5, 0, f"{tmp}/prio/mid", priority=0)
    # what KEDA sees with no worker at all: 15 waiting (wakes the first), 0 running
    check(keda_signals() == (15, 0), f"lag and pending with 15 queued, no worker: {keda_signals()}")
    one = start_worker(tmp, url, "--slots", "1", "--chunk-bytes", "4096", "--exec-log", log, name="one")
    wait_all(ep, lo + hi + mid, 60)
    order = [int(l.split()[1]) for l in open(log).read().splitlines() if l.startswith("start")]
    check(order == hi + mid + lo, f"run order {order}, want {hi + mid + lo}")
    check(keda_signals() == (0, 0), f"lag and pending once all ran: {keda_signals()}")
    one.send_signal(signal.SIGTERM)
    check(one.wait(10) == 0, "idle worker did not exit 0 on SIGTERM")
    # faults: 3 workers, 60 jobs of ~0.3 s
    os.mkdir(f"{tmp}/out")
    ws = {n: start_worker(tmp, url, "--slots", "2", "--chunk-bytes", "4096", "--lease-ms", "1000",
                          "--exec-log", log, name=n) for n in ("qa", "qb", "qc")}
    ids = submit_many(ep, tmp, 60, 30, f"{tmp}/out")
    wait_for(lambda: len(exec_counts(log, "start")) >= 15 + 10, 30, "work to start")
    ws["qa"].send_signal(signal.SIGKILL)
    ws["qa"].wait()
    ws["qb"].send_signal(signal.SIGTERM)  # drains: its 2 jobs finish, then it exits
    check(ws["qb"].wait(30) == 0, f"draining worker exit {ws['qb'].returncode}")
    ws["qd"] = start_worker(tmp, url, "--slots", "2", "--chunk-bytes", "4096", "--lease-ms", "1000",
                            "--exec-log", log, name="qd")
    wait_all(ep, ids, 120)
    check_exactly_once(tmp, log, ids, f"{tmp}/out", f"{tmp}/in.bin")
    lost = [st for st in (status(ep, j) for j in ids) if st["attempts"] > 1]
    check(all(any("lease expired" in e["error"] for e in st["errors"]) for st in lost),
          f"retried jobs without a lease-expired error: {lost[:2]}")
    wrong = [st for st in (status(ep, j) for j in ids[:5]) if st["done"] != 10 or st["total"] != 10]
    check(not wrong, f"progress of succeeded jobs: {wrong[:2]}")
    # after a kill -9 (expired leases retried) and a drain: nothing left to scale on
    check(keda_signals() == (0, 0), f"lag and pending once all ran: {keda_signals()}")
    print(f"queue-workers: {len(lost)} jobs re-run after the kill -9 of a worker")


def case_redis_kill(tmp):
    """Redis only: kill -9 of redis-server with jobs queued and running, then
    a restart on its AOF: every job succeeds, runs to completion once, and
    no output is written twice. With appendfsync always, so that nothing
    Redis acknowledged is lost; with everysec a busy disk can lose the last
    2 s, and a job finished then runs again (docs/jobs.md, "Durability")."""
    check(BACKEND == "redis", "this case needs --backend redis")
    REDIS["fsync"] = "always"
    log = f"{tmp}/exec.log"
    p, ep = start_serve(tmp, "--workers", "2", "--lease-ms", "1500", "--backoff-ms", "50",
                        "--chunk-bytes", "4096", "--exec-log", log)
    url = REDIS["url"]
    w = start_worker(tmp, url, "--slots", "2", "--chunk-bytes", "4096", "--lease-ms", "1500",
                     "--exec-log", log, name="rk")
    make_file(f"{tmp}/in.bin", 40_000, 43)
    os.mkdir(f"{tmp}/out")
    ids = submit_many(ep, tmp, 60, 20, f"{tmp}/out")
    wait_for(lambda: len(exec_counts(log)) >= 8, 30, "some jobs to finish")
    REDIS["proc"].send_signal(signal.SIGKILL)
    REDIS["proc"].wait()
    time.sleep(1.0)
    start_redis(tmp, REDIS["port"])
    wait_all(ep, ids, 120)
    check_exactly_once(tmp, log, ids, f"{tmp}/out", f"{tmp}/in.bin")
    check(p.poll() is None and w.poll() is None, "the gateway or the worker died with redis")
    check(keda_signals() == (0, 0), f"lag and pending once all ran after the AOF reload: {keda_signals()}")


def case_redis_frozen(tmp):
    """Redis only: a redis-server that stops answering (SIGSTOP: connections
    stay open, replies never come). The gateway and a stateless worker go on
    once it answers again; a gateway told to stop (SIGTERM) while it does
    not answer stops within a few timeouts, not one per call it makes; each
    says what failed once, not at every tick. (Before, each call of every
    tick waited its 5 s timeout: 34 s to stop.)"""
    check(BACKEND == "redis", "this case needs --backend redis")
    p, ep = start_serve(tmp, "--workers", "1")
    w = start_worker(tmp, REDIS["url"], name="frz")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    # the worker runs (an outage at its start is queue_wait's case)
    wait_for(lambda: "worker leasing from" in open(f"{tmp}/worker-frz.log").read(), 20, "the worker to start")
    REDIS["proc"].send_signal(signal.SIGSTOP)
    try:
        time.sleep(12)
    finally:
        REDIS["proc"].send_signal(signal.SIGCONT)
    for who, path in (("gateway", f"{tmp}/serve.log"), ("worker", f"{tmp}/worker-frz.log")):
        bad = [l for l in open(path).read().splitlines() if '"level":"error"' in l or '"level":"warn"' in l]
        check(bad and len(bad) <= 12 and all("no answer within 5 s" in l for l in bad),
              f"the {who} should say, a few times, that redis did not answer: {len(bad)} lines: {bad[:20]}")
        wait_for(lambda: "the job queue answers again" in open(path).read(), 15, f"the {who} to say redis is back")
    for _ in range(3):
        cli("submit", "noop", "--wait", "--connect", ep, timeout=60, check_rc=0)
    check(p.poll() is None and w.poll() is None, "the gateway or the worker died while redis did not answer")
    REDIS["proc"].send_signal(signal.SIGSTOP)
    try:
        time.sleep(2)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(25)
        except subprocess.TimeoutExpired:
            raise Fail("the gateway did not stop within 25 s of SIGTERM while redis did not answer")
        took = time.monotonic() - t0
    finally:
        REDIS["proc"].send_signal(signal.SIGCONT)
    check(rc == 0 and took < 16, f"the gateway stopped after {took:.1f} s (exit {rc}); at most 3 timeouts of 5 s")
    print(f"gateway stopped {took:.1f} s after SIGTERM while redis did not answer")


def case_queue_wait(tmp):
    """Redis only: a gateway and a stateless worker started before their
    Redis (a deployment starts every pod at once) wait for it: /healthz 200,
    /readyz 503 "waiting for the job queue", no ready line, one warning that
    names the queue and why; once redis-server runs, both are ready and a
    job runs on the worker. --queue-wait bounds the wait (exit 1, naming
    it; 0: at once); SIGTERM while waiting stops (exit 0); a refusal by
    Redis (no or a wrong password) stops at once, whatever the wait.
    (Before, both exited at once when Redis was not there yet.)"""
    check(BACKEND == "redis", "this case needs --backend redis")
    import select
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    hs, hw = free_port(), free_port()
    serve = subprocess.Popen([SPINDLE, "serve", "--bind", "tcp://127.0.0.1:*", "--queue", url, "--root", tmp,
                              "--workers", "0", "--http", f"127.0.0.1:{hs}"], stdout=subprocess.PIPE,
                             stderr=open(f"{tmp}/serve.log", "ab"), cwd=tmp)
    PROCS.append(serve)
    w = start_worker(tmp, url, "--http", f"127.0.0.1:{hw}", name="early")

    def get(port, path):
        try:
            return http_get(port, path)
        except OSError:
            return None
    for port_, who in ((hs, "gateway"), (hw, "worker")):
        wait_for(lambda: get(port_, "/healthz") == (200, "ok\n"), 10, f"the {who}'s /healthz while it waits")
        check(get(port_, "/readyz") == (503, "waiting for the job queue\n"),
              f"the {who}'s /readyz before redis runs: {get(port_, '/readyz')}")
    time.sleep(3)
    check(select.select([serve.stdout], [], [], 0)[0] == [], "the gateway said it was ready before its queue answered")
    for who, path in (("gateway", f"{tmp}/serve.log"), ("worker", f"{tmp}/worker-early.log")):
        lines = [l for l in open(path).read().splitlines() if '"level":"' in l and '"level":"info"' not in l]
        want = f"waiting for the job queue, up to 300 s (--queue-wait): redis queue {url}/0: cannot connect"
        check(len(lines) == 1 and want in lines[0], f"the {who} should say once why it waits: {lines}")
    start_redis(tmp, port)
    r, _, _ = select.select([serve.stdout], [], [], 15)
    line = serve.stdout.readline().decode() if r else ""
    check("ready on " in line, f"the gateway's ready line once redis runs: {line!r}")
    ep = line.split("ready on ")[1].strip()
    for port_, who in ((hs, "gateway"), (hw, "worker")):
        wait_for(lambda: get(port_, "/readyz") == (200, "ready\n"), 10, f"the {who} to be ready once redis runs")
    for path in (f"{tmp}/serve.log", f"{tmp}/worker-early.log"):
        check("the job queue answers (after " in open(path).read(), f"{path}: no line that the queue answers")
    # --workers 0: the stateless worker ran it
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    for p in (serve, w):
        p.send_signal(signal.SIGTERM)
        check(p.wait(20) == 0, f"{' '.join(p.args[:2])} exit {p.returncode} on SIGTERM")

    none = f"redis://127.0.0.1:{free_port()}"
    for what in ("serve", "worker"):
        args = [SPINDLE, what, "--queue", none] + (["--bind", "tcp://127.0.0.1:*"] if what == "serve" else
                                                    ["--name", "late"])
        t0 = time.monotonic()
        r = subprocess.run(args + ["--queue-wait", "2"], capture_output=True, timeout=30)
        took = time.monotonic() - t0
        err = r.stderr.decode()
        check(r.returncode == 1 and 1.9 < took < 10 and
              f"no answer from the job queue in 2 s (--queue-wait): redis queue {none}/0: cannot connect" in err,
              f"{what} --queue-wait 2 without redis: exit {r.returncode} after {took:.1f} s: {err}")
        t0 = time.monotonic()
        r = subprocess.run(args + ["--queue-wait", "0"], capture_output=True, timeout=30)
        took = time.monotonic() - t0
        check(r.returncode == 1 and took < 1.5 and "cannot connect" in r.stderr.decode(),
              f"{what} --queue-wait 0 without redis: exit {r.returncode} after {took:.1f} s: {r.stderr!r}")
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        PROCS.append(p)
        time.sleep(1.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(10)
        check(rc == 0 and time.monotonic() - t0 < 3, f"{what} waiting for redis, SIGTERM: exit {rc} after "
              f"{time.monotonic() - t0:.1f} s")

    redis_call("CONFIG", "SET", "requirepass", "sekrit")
    with open(f"{tmp}/wrong.auth", "w") as f:
        f.write("nope\n")
    for what in ("serve", "worker"):
        extra = ["--bind", "tcp://127.0.0.1:*"] if what == "serve" else ["--name", "pw"]
        for auth, words in (([], "NOAUTH"), (["--queue-auth-file", f"{tmp}/wrong.auth"], "WRONGPASS")):
            t0 = time.monotonic()
            r = subprocess.run([SPINDLE, what, "--queue", url, *extra, *auth], capture_output=True, timeout=30)
            took = time.monotonic() - t0
            check(r.returncode == 1 and took < 2 and words in r.stderr.decode(),
                  f"{what} refused by redis ({words}): exit {r.returncode} after {took:.1f} s: {r.stderr!r}")


def case_gateway_kill_shared(tmp):
    """Redis only: two gateways on one queue. A job is readable and
    cancellable from either; kill -9 of one gateway with jobs running and
    queued: the other runs everything, each output published once."""
    check(BACKEND == "redis", "this case needs --backend redis")
    log = f"{tmp}/exec.log"
    args = ["--workers", "2", "--lease-ms", "1000", "--backoff-ms", "50", "--chunk-bytes", "4096",
            "--exec-log", log]
    pa, epa = start_serve(tmp, *args, log="a.log")
    pb, epb = start_serve(tmp, *args, log="b.log")
    make_file(f"{tmp}/in.bin", 40_000, 47)
    # cancel through B a job running on either gateway
    j = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/x.bin",
                "--param", "chunk_delay_ms=300", "--connect", epa, check_rc=0).stdout.split()[0])
    wait_for(lambda: status(epb, j)["state"] == "running", 10, "the job to run (seen from B)")
    cli("cancel", str(j), "--connect", epb, check_rc=0)
    w = cli("watch", str(j), "--connect", epa, timeout=30, check_rc=3)
    check(b"cancelled" in w.stdout, f"watch on A after a cancel on B: {w.stdout!r}")
    check(not os.path.exists(f"{tmp}/x.bin"), "cancelled job left an output")
    os.mkdir(f"{tmp}/out")
    ids = submit_many(epa, tmp, 40, 20, f"{tmp}/out")
    # kill once six outputs are published, as case_gateway_kill does: not
    # right after a runner's "done" line, which lands the kill in the moment
    # between that run's end and its publish (the job must then run again,
    # and its runner finishes twice)
    wait_for(lambda: len([f for f in os.listdir(f"{tmp}/out") if not f.startswith(".")]) >= 6, 30,
             "some jobs to finish")
    pa.send_signal(signal.SIGKILL)
    pa.wait()
    # A job whose runner had finished on A ("done") but whose publication
    # marker A had not yet written runs again on B: nothing of it was
    # published. One with its marker or its output in place must not.
    left, done_at_kill = set(os.listdir(f"{tmp}/out")), exec_counts(log)
    may_repeat = {j for i, j in enumerate(ids)
                  if j in done_at_kill and f"{i}.bin" not in left and f".spn-{j}.published" not in left}
    wait_all(epb, ids, 120)
    check_exactly_once(tmp, log, ids, f"{tmp}/out", f"{tmp}/in.bin", may_repeat)
    st = status(epb, ids[-1])
    check(st["done"] == st["total"] == 10, f"progress of a succeeded job: {st}")


def case_output_taken(tmp):
    """Two jobs queued or running at once with one output path: the second
    SUBMIT is refused, naming the first job and its state (before, both ran
    and the last to finish silently replaced the other's file); so is a job
    whose input is a queued job's output (it would read a stale file). The same
    request again with its idempotency key is the first job, not a clash; a
    path is free again once its job is cancelled or has ended; the record is
    in the queue, so a restarted gateway still knows it."""
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "0")
    where = REDIS["url"] if BACKEND == "redis" else ep
    make_file(f"{tmp}/in.bin", 20_000, 3)
    os.mkdir(f"{tmp}/out")
    real = os.path.realpath(tmp)

    def submit(out, *extra, rc=0, pipeline="copy"):
        io = ["--input", f"in={tmp}/in.bin", "--output", f"out={out}"] if pipeline == "copy" else \
            ["--output", f"frames={out}"]
        return cli("submit", pipeline, *io, *extra, "--connect", ep, check_rc=rc)

    a = int(submit(f"{tmp}/out/a.bin", "--idempotency-key", "ka").stdout.split()[0])
    # the same file spelled another way
    e = submit(f"{tmp}/out/../out/a.bin", rc=5).stderr.decode()
    check(f"outputs.out ({real}/out/a.bin) is the output of job {a}, which is queued" in e and
          f"cancel job {a} first" in e, f"a second job on a queued job's output: {e}")
    again = int(submit(f"{tmp}/out/a.bin", "--idempotency-key", "ka").stdout.split()[0])
    check(again == a, f"the same request with its idempotency key is job {a}, not {again}")
    b = int(submit(f"{tmp}/out/b.bin").stdout.split()[0])
    # a job that would replace the input of queued jobs (a and b read in.bin)
    make_file(f"{tmp}/in2.bin", 100, 5)
    e = cli("submit", "copy", "--input", f"in={tmp}/in2.bin", "--output", f"out={tmp}/in.bin", "--connect", ep,
            check_rc=5).stderr.decode()
    check(any(f"outputs.out ({real}/in.bin) is an input of job {j}, which is queued: this job would replace the "
              f"file job {j} reads" in e for j in (a, b)), f"a job writing a queued job's input: {e}")
    cli("cancel", str(a), "--connect", ep, check_rc=0)
    # a repeat of a keyed request is that job, checked when it came first:
    # not refused because a job now reads what it wrote (job k, cancelled;
    # job rd, queued, reads k's output)
    k = int(submit(f"{tmp}/out/k.bin", "--idempotency-key", "kk").stdout.split()[0])
    cli("cancel", str(k), "--connect", ep, check_rc=0)
    make_file(f"{tmp}/out/k.bin", 100, 11)
    rd = int(cli("submit", "copy", "--input", f"in={tmp}/out/k.bin", "--output", f"out={tmp}/out/rd.bin",
                 "--connect", ep, check_rc=0).stdout.split()[0])
    e = submit(f"{tmp}/out/k.bin", rc=5).stderr.decode()
    check(f"is an input of job {rd}" in e, f"a new job replacing job {rd}'s input: {e}")
    again = int(submit(f"{tmp}/out/k.bin", "--idempotency-key", "kk").stdout.split()[0])
    check(again == k, f"the repeat of job {k}'s keyed request: job {again}")
    c = int(submit(f"{tmp}/out/a.bin").stdout.split()[0])
    e = submit(f"{tmp}/out/a.bin", rc=5).stderr.decode()
    check(f"is the output of job {c}, which is queued" in e, f"after the cancel, job {c} holds the path: {e}")
    if BACKEND != "redis":
        # a gateway restarted on the queue file still knows job c's output
        p.send_signal(signal.SIGTERM)
        check(p.wait(30) == 0, f"serve exited {p.returncode} on SIGTERM")
        p, ep = start_serve(tmp, "--config", cfg, "--workers", "0")
        where = ep
        e = submit(f"{tmp}/out/a.bin", rc=5).stderr.decode()
        check(f"is the output of job {c}, which is queued" in e, f"after a restart: {e}")
    # a job that would read what job c is yet to write (here a stale file of
    # that name) is refused too, until job c has ended
    make_file(f"{tmp}/out/a.bin", 100, 9)
    e = cli("submit", "copy", "--input", f"in={tmp}/out/a.bin", "--output", f"out={tmp}/out/chain.bin",
            "--connect", ep, check_rc=5).stderr.decode()
    check(f"inputs.in ({real}/out/a.bin) is the output of job {c}, which is queued: this job would read the file "
          f"before or while job {c} writes it" in e, f"a job reading a queued job's output: {e}")
    start_worker(tmp, where, "--config", cfg, "--slots", "1", name="w")
    wait_all(ep, [b, c], 30, "the copy jobs to succeed")
    check(same(f"{tmp}/in.bin", f"{tmp}/out/a.bin"), "job c's output")
    chain = int(cli("submit", "copy", "--input", f"in={tmp}/out/a.bin", "--output", f"out={tmp}/out/chain.bin",
                    "--connect", ep, check_rc=0).stdout.split()[0])
    # (job chain reads a.bin: until it has ended, a.bin is not to be replaced)
    wait_all(ep, [b, c, chain], 30, "the job reading job c's output to succeed")
    # an ended job does not hold its path: the file is rendered again
    d = int(submit(f"{tmp}/out/a.bin").stdout.split()[0])
    wait_all(ep, [b, c, chain, d], 30, "the job on an ended job's output to succeed")
    # once every reader of in.bin has ended, a job may replace it
    r2 = int(cli("submit", "copy", "--input", f"in={tmp}/in2.bin", "--output", f"out={tmp}/in.bin", "--connect", ep,
                 check_rc=0).stdout.split()[0])
    wait_all(ep, [b, c, chain, d, r2], 30, "the job replacing an input no job reads any more")
    check(same(f"{tmp}/in2.bin", f"{tmp}/in.bin"), "in.bin replaced")
    # a running job holds its path (any pipeline's output)
    slow = int(submit(f"{tmp}/out/s.raw", "--param", "frames=1000", pipeline="slow").stdout.split()[0])
    wait_for(lambda: status(ep, slow)["state"] == "running", 20, "the slow job to run")
    e = submit(f"{tmp}/out/s.raw", rc=5).stderr.decode()
    check(f"outputs.out ({real}/out/s.raw) is the output of job {slow}, which is running" in e,
          f"a job on a running job's output: {e}")
    cli("cancel", str(slow), "--connect", ep, check_rc=0)
    wait_for(lambda: status(ep, slow)["state"] == "cancelled", 20, "the slow job to be cancelled")
    e2 = submit(f"{tmp}/out/s.raw")
    check(e2.returncode == 0, "the cancelled job's path is free")


def case_output_race(tmp):
    """Redis only: two gateways on one queue, each sent a SUBMIT of the same
    output path at the same moment, 100 times over: exactly one of each pair
    is stored and the other refused, naming it; and so for an input that is
    the output of a SUBMIT in flight through the other gateway. (Before, each
    gateway looked the path up and then stored its job, so both could pass
    between the two: the check is now in the script that stores the job.)"""
    check(BACKEND == "redis", "this case needs --backend redis")
    pa, epa = start_serve(tmp, "--workers", "0", log="a.log")
    pb, epb = start_serve(tmp, "--workers", "0", log="b.log")
    make_file(f"{tmp}/in.bin", 1000, 5)
    os.mkdir(f"{tmp}/out")
    real = os.path.realpath(tmp)
    ctx = zmq.Context()
    ra, rb = Raw(ctx, epa), Raw(ctx, epb)
    n = 100
    for i in range(n):
        # even rounds: one output twice; odd rounds: B reads what A writes
        a = {"req": i + 1, "pipeline": "copy", "inputs": {"in": f"{tmp}/in.bin"},
             "outputs": {"out": f"{tmp}/out/{i}.bin"}}
        b = dict(a, req=i + 1)
        if i % 2:
            make_file(f"{tmp}/out/{i}.bin", 100, i)  # (a stale file of an earlier render)
            b = dict(b, inputs={"in": f"{tmp}/out/{i}.bin"}, outputs={"out": f"{tmp}/out/{i}.copy"})
        ra.req("SUBMIT", a)
        rb.req("SUBMIT", b)
    got = {}
    for who, r in (("A", ra), ("B", rb)):
        for _ in range(n):
            m = r.recv(10000)
            check(m is not None, f"no reply from gateway {who}")
            got[(who, m[1]["req"])] = m
    for i in range(n):
        ma, mb = got[("A", i + 1)], got[("B", i + 1)]
        kinds = sorted([ma[0], mb[0]])
        check(kinds == ["ERROR", "SUBMITTED"], f"round {i}: both or neither stored: {ma} / {mb}")
        ok, err = (ma, mb) if ma[0] == "SUBMITTED" else (mb, ma)
        msg = err[1].get("message", "")
        j = ok[1]["id"]
        if i % 2 == 0:
            want = f"outputs.out ({real}/out/{i}.bin) is the output of job {j}, which is queued"
        elif ok is ma:
            want = f"inputs.in ({real}/out/{i}.bin) is the output of job {j}, which is queued"
        else:
            want = f"outputs.out ({real}/out/{i}.bin) is an input of job {j}, which is queued"
        check(err[1].get("code") == "invalid" and want in msg, f"round {i}: refusal {err}")
    ra.close()
    rb.close()
    # the queue holds one job per round
    ls = cli("jobs", "--state", "queued", "--limit", "1000", "--connect", epb, check_rc=0).stdout.decode()
    check(len([ln for ln in ls.splitlines() if "queued" in ln]) == n, f"queued jobs: {ls}")


def case_retention(tmp):
    """queue.keep_ended_s (--keep-ended): a job that ended is deleted that
    long after it ended: its status is then not_found, it leaves `spindle
    jobs`, its idempotency key names a new job; its output file stays (the
    queue's records go, never the files); a running and a queued job stay
    however old they are. The gateway logs each pass that deleted jobs."""
    port = free_port()
    p, ep = start_serve(tmp, "--workers", "1", "--keep-ended", "2", "--chunk-bytes", "500", "--http",
                        f"127.0.0.1:{port}")
    make_file(f"{tmp}/in.bin", 20_000, 9)
    os.mkdir(f"{tmp}/out")

    def submit(name, *extra, rc=0):
        r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out/{name}", *extra,
                "--connect", ep, check_rc=rc)
        return int(r.stdout.split()[0])
    a = submit("a.bin", "--idempotency-key", "ka", "--wait")
    check(status(ep, a)["state"] == "succeeded", "job a ran")
    # one job runs (slowly) and one waits behind it, past the retention
    slow = submit("slow.bin", "--param", "chunk_delay_ms=300")  # 40 chunks: 12 s
    wait_for(lambda: status(ep, slow)["state"] == "running", 20, "the slow job to run")
    queued = submit("q.bin")

    def gone(j):
        r = cli("status", str(j), "--connect", ep)
        return r.returncode == 5 and f"job {j}: no such job".encode() in r.stderr
    # an id the queue does not have: maybe deleted by retention, and so said
    r = cli("status", "999", "--connect", ep, check_rc=5)
    check(b"job 999: no such job (or no longer: an ended job is deleted 2 s after it ended, queue.keep_ended_s)"
          in r.stderr, f"status of an unknown id: {r.stderr!r}")
    r = cli("cancel", "999", "--connect", ep, check_rc=5)
    check(b"no longer: an ended job is deleted 2 s after it ended" in r.stderr, f"cancel of an unknown id: {r.stderr!r}")
    wait_for(lambda: gone(a), 20, "job a to be deleted 2 s after it ended")
    check(same(f"{tmp}/in.bin", f"{tmp}/out/a.bin"), "job a's output file is still there")
    time.sleep(3)
    check(status(ep, slow)["state"] == "running" and status(ep, queued)["state"] == "queued",
          "a running and a queued job are kept")
    ls = cli("jobs", "--limit", "100", "--connect", ep, check_rc=0).stdout.decode()
    ids = [int(ln.split()[0]) for ln in ls.splitlines() if ln.split() and ln.split()[0].isdigit()]
    check(a not in ids and slow in ids and queued in ids, f"spindle jobs after the deletion: {ls}")
    again = submit("a.bin", "--idempotency-key", "ka")
    check(again != a, f"job a's key names a new job, not {again}")
    cli("cancel", str(slow), "--connect", ep, check_rc=0)
    wait_for(lambda: gone(slow) and gone(queued) and gone(again), 40, "the other jobs to be deleted once ended")
    log = open(f"{tmp}/serve.log").read()
    check("retention: deleted 1 job that ended over 2 s ago" in log, f"no retention line in the log: {log[-2000:]}")
    # counted: the gateway's deletions, and the queue's (every job deleted)
    body = http_get(port, "/metrics")[1]
    for fam in ("spindle_job_events_total", "spindle_queue_events_total"):
        check(f'{fam}{{event="deleted"}} 4' in body, f"{fam} deleted: {body}")


def case_mixed_workers(tmp):
    """A farm whose workers load different pipelines (remote workers on a
    gateway; with --backend redis, stateless workers on the queue): each
    worker leases only jobs of the pipelines it runs (with Redis, so do the
    own workers of a second gateway whose config lacks one). A job of a pipeline no
    worker runs waits, queued with no attempt spent, while the jobs behind
    it run, and runs once a worker that has its pipeline arrives. (Before,
    the first free worker took it and failed it: "unknown pipeline".)"""
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "0", "--max-attempts", "1")
    where = REDIS["url"] if BACKEND == "redis" else ep
    if BACKEND == "redis":
        # a second gateway on the same queue, without the synthetic pipeline,
        # whose own workers must leave that job alone too
        start_serve(tmp, "--workers", "2", db="q2.db", log="serve2.log")
    os.mkdir(f"{tmp}/out")
    make_file(f"{tmp}/in.bin", 20_000, 5)
    # the synthetic job first and at a higher priority, copy jobs behind it
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/s.raw", "--param", "frames=5",
            "--priority", "5", "--connect", ep, check_rc=0)
    syn = int(r.stdout.split()[0])
    copies = submit_many(ep, tmp, 4, 0, f"{tmp}/out")
    # a worker with the built-in test pipelines only (no --config)
    start_worker(tmp, where, "--slots", "2", name="plain")
    wait_all(ep, copies, 30, "the copy jobs to succeed on the worker without the synthetic pipeline")
    st = status(ep, syn)
    check(st["state"] == "queued" and st["attempts"] == 0 and not st.get("errors"),
          f"the synthetic job, which no worker runs yet: {st}")
    # its status says why it waits, and so does `spindle jobs`
    check('no worker that runs pipeline "synthetic" has been seen' in st.get("waiting", ""),
          f"the synthetic job's status says why it waits: {st}")
    rows = cli("jobs", "--state", "queued", "--connect", ep, check_rc=0).stdout.decode().splitlines()
    row = [l for l in rows[1:] if l.split()[0] == str(syn)]
    check(len(row) == 1 and "synthetic" in row[0] and row[0].rstrip().endswith("waiting: no worker runs this pipeline"),
          f"spindle jobs --state queued: {rows}")
    # spindle workers: what runs the jobs, and which pipelines have a worker
    def pipelines_table():
        out = cli("workers", "--connect", ep, check_rc=0).stdout.decode()
        rows = out.split("\nPIPELINE", 1)[1].splitlines()[1:]
        return out, {l.split()[0]: l.split(None, 1)[1] for l in rows if l.strip()}
    out, have = pipelines_table()
    check(have.get("synthetic") == "none (never seen)" and have.get("copy") == "yes", f"spindle workers: {out}")
    if BACKEND != "redis":
        check(any(l.split()[:2] == ["remote:plain", "remote"] and l.endswith("copy, fail, noop")
                  for l in out.splitlines()), f"spindle workers lists the remote worker: {out}")
    watch = subprocess.Popen([SPINDLE, "watch", str(syn), "--connect", ep], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    PROCS.append(watch)
    plain_log = open(f"{tmp}/worker-plain.log", errors="replace").read()
    check("pipelines: copy, fail, noop" in plain_log, f"the plain worker's start line: {plain_log[-1500:]}")
    # the watch has seen the job wait before a worker that runs it arrives
    # (a slow start, under ASan, would otherwise first see it running)
    waited = f"job {syn} is waiting: no worker that runs pipeline \"synthetic\"".encode()
    early = read_until(watch.stderr, waited, 30)
    check(waited in early, f"spindle watch of the waiting synthetic job: {early!r}")
    # a worker that loads the synthetic pipeline takes it
    start_worker(tmp, where, "--config", cfg, "--slots", "1", name="full")
    wait_all(ep, [syn], 60, "the synthetic job to succeed on the worker that has its pipeline")
    st = status(ep, syn)
    check(st["attempts"] == 1 and not st.get("errors") and "waiting" not in st, f"the synthetic job: {st}")
    out, err = watch.communicate(timeout=30)
    err = early + err
    check(watch.returncode == 0 and waited in err and f"job {syn}: succeeded".encode() in err,
          f"spindle watch of the synthetic job said why it waited: exit {watch.returncode}, {err!r}")
    out, have = pipelines_table()
    check(have.get("synthetic") == "yes", f"spindle workers once a worker runs synthetic: {out}")
    # a worker that runs synthetic is there, busy (its one slot on a slow
    # job, 3 s): a new synthetic job queues behind it and does not say it waits
    r = cli("submit", "slow", "--output", f"frames={tmp}/out/slow.raw", "--param", "frames=150",
            "--connect", ep, check_rc=0)
    slow = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, slow)["state"] == "running", 20, "the slow job to run")
    r = cli("submit", "synthetic", "--output", f"frames={tmp}/out/s2.raw", "--param", "frames=2", "--wait",
            "--connect", ep, check_rc=0)
    check(b"waiting" not in r.stderr, f"submit --wait once a busy worker runs synthetic: {r.stderr!r}")
    check(status(ep, slow)["state"] == "succeeded", "the slow job ended before the synthetic job behind it")
    check(read(f"{tmp}/out/s.raw") == synth_expected(syn, 5), "the synthetic job's output")
    full_log = open(f"{tmp}/worker-full.log", errors="replace").read()
    check("pipelines: synthetic, slow, checked, two, copy, fail, noop" in full_log,
          f"the full worker's start line: {full_log[-1500:]}")
    for log in ("worker-plain.log", "serve2.log"):
        if os.path.exists(f"{tmp}/{log}"):
            check('"pipeline":"synthetic"' not in open(f"{tmp}/{log}", errors="replace").read(),
                  f"{log}: a worker without the synthetic pipeline touched its job")
    check(p.poll() is None, "gateway died")


def case_watch_waiting(tmp):
    """spindle watch of a queued job says when its pipeline's last worker
    has gone (the job waits for one), and when a worker that runs it is
    there again, busy (queued until one is free); then the job runs. A
    draining worker no longer counts as there. (Before, watch said only
    what the first status said.)"""
    cfg = pipeline_config(tmp)
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "0", "--heartbeat-ms", "300")
    os.mkdir(f"{tmp}/out")
    a = start_worker(tmp, ep, "--config", cfg, "--slots", "1", "--heartbeat-ms", "300", "--drain-grace-s", "120",
                     name="a")

    def submit(pipeline, name, frames, prio=0):
        r = cli("submit", pipeline, "--output", f"frames={tmp}/out/{name}.raw", "--param", f"frames={frames}",
                "--priority", str(prio), "--connect", ep, check_rc=0)
        return int(r.stdout.split()[0])
    slow1 = submit("slow", "slow1", 3000)  # 60 s: worker a drains all along
    wait_for(lambda: status(ep, slow1)["state"] == "running", 20, "the first slow job to run on worker a")
    job = submit("synthetic", "job", 3)
    st = status(ep, job)
    check(st["state"] == "queued" and "waiting" not in st, f"queued behind a busy worker: {st}")
    watch_err = f"{tmp}/watch.err"
    watch = subprocess.Popen([SPINDLE, "watch", str(job), "--connect", ep], stdout=subprocess.PIPE,
                             stderr=open(watch_err, "wb"))
    PROCS.append(watch)
    t0 = time.monotonic()
    a.send_signal(signal.SIGTERM)  # drains: runs slow1 on, takes nothing more

    def a_row():
        return [w for w in json.loads(cli("workers", "--json", "--connect", ep, check_rc=0).stdout)["workers"]
                if w["name"] == "remote:a"]
    wait_for(lambda: a_row() and a_row()[0]["draining"], 5, "spindle workers to show worker a draining")
    check(a_row()[0]["running"] == 1 and not a_row()[0]["gone"], f"worker a, draining: {a_row()}")
    wait_for(lambda: "waiting" in status(ep, job), 25, "the job's status to say it waits")
    # the gateway looks at its watched jobs every 5 s
    wait_for(lambda: "is waiting" in open(watch_err).read(), 10, "spindle watch to say the job waits")
    took = time.monotonic() - t0
    check(status(ep, slow1)["state"] == "running" and a.poll() is None,
          "worker a still drains (a draining worker is not one that runs the pipeline)")
    cli("cancel", str(slow1), "--connect", ep, check_rc=0)
    check(a.wait(30) == 0, f"worker a exited {a.returncode} after SIGTERM and the cancel of its job")
    check(status(ep, job)["state"] == "queued", "worker a left the synthetic job queued")
    # a worker that runs synthetic is there again, busy on a job before it
    slow2 = submit("slow", "slow2", 150, prio=9)
    start_worker(tmp, ep, "--config", cfg, "--slots", "1", name="b")
    wait_for(lambda: status(ep, slow2)["state"] == "running", 20, "the second slow job to run on worker b")
    out, _ = watch.communicate(timeout=60)
    err = open(watch_err).read()
    lines = [l for l in err.splitlines() if l.startswith("spindle watch:")]
    want = [f'spindle watch: job {job} is waiting: no worker that runs pipeline "synthetic" has been seen',
            f'spindle watch: job {job}: a worker that runs pipeline "synthetic" is there now; the job is queued '
            'until one is free']
    check(len(lines) == 2 and lines[0].startswith(want[0]) and lines[1] == want[1],
          f"spindle watch's lines about the wait: {err!r}")
    check(watch.returncode == 0 and out.decode().split() == [str(job), "succeeded"], f"watch: {watch.returncode} {out!r}")
    check(status(ep, slow2)["state"] == "succeeded", "the job ran after the slow job before it")
    check(read(f"{tmp}/out/job.raw") == synth_expected(job, 3), "the synthetic job's output")
    print(f"spindle watch said the job waits {took:.1f} s after the only worker of its pipeline began to drain")


def case_worker_name_taken(tmp):
    """Two worker processes given one --name: the second is refused the name
    (name_taken) and exits 1 with an error naming it, while the first keeps
    its job and its place. A worker frozen past three heartbeats and started
    again under its name gets the name once the gateway counts the old
    process lost; the old one, woken, is refused in turn and exits. On Redis,
    a process of that name at another gateway is refused too. (Before, two
    processes of one name shared one entry on the gateway, each message
    moving it to its own connection, and when one was reaped the other's
    running jobs failed.)"""
    hb = ("--heartbeat-ms", "300")
    p, ep = start_serve(tmp, "--workers", "0", *hb)
    a = start_worker(tmp, ep, "--chunk-bytes", "8192", *hb, name="dup")
    make_file(f"{tmp}/in.bin", 160_000, 5)  # 20 chunks
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/a.bin",
            "--param", "chunk_delay_ms=100", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 2, 20, "the job to run on the first worker")

    def refused(log, where):
        w = start_worker(tmp, ep if where == "here" else where, *hb, name="dup", log=log)
        try:
            rc = w.wait(40)
        except subprocess.TimeoutExpired:
            raise Fail(f"a second worker named dup still runs after 40 s: {open(f'{tmp}/{log}').read()}")
        text = open(f"{tmp}/{log}").read()
        check(rc == 1 and 'refuses the name: worker name "dup" is taken by another worker process' in text,
              f"the second worker: exit {rc}; {text}")
        return text
    text = refused("worker-dup-2.log", "here")
    check("connected to this gateway" in text and "give each worker its own --name" in text, text)
    check(a.poll() is None, "the first worker exited")
    cli("watch", str(jid), "--connect", ep, timeout=60, check_rc=0)
    st = status(ep, jid)
    check(st["attempts"] == 1 and st["errors"] == [],
          f"the first worker's job should end in its first attempt: {st}")
    check(same(f"{tmp}/in.bin", f"{tmp}/a.bin"), "output")
    serve_log = open(f"{tmp}/serve.log").read()
    check(serve_log.count("refused a second worker process") == 1, f"one warning on the gateway: {serve_log}")
    rows = json.loads(cli("workers", "--json", "--connect", ep, check_rc=0).stdout)["workers"]
    check([w["name"] for w in rows] == ["remote:dup"], f"one worker listed: {rows}")

    if BACKEND == "redis":  # another gateway of the queue refuses the name too
        pb, epb = start_serve(tmp, "--workers", "0", *hb, db="q2.db", log="b.log")
        text = refused("worker-dup-b.log", epb)
        check(f"connected to gateway {socket.gethostname()}:{p.pid}" in text, text)
        check(a.poll() is None, "the first worker exited")

    # frozen past three heartbeats: the name goes to the new process
    a.send_signal(signal.SIGSTOP)
    try:
        c = start_worker(tmp, ep, *hb, name="dup", log="worker-dup-3.log")
        r = cli("submit", "noop", "--wait", "--connect", ep, timeout=30)
        check(r.returncode == 0, f"a job on the restarted worker: {r}; {open(f'{tmp}/worker-dup-3.log').read()}")
        check(c.poll() is None, "the restarted worker exited")
    finally:
        a.send_signal(signal.SIGCONT)
    check(a.wait(40) == 1, f"the woken worker should be refused and exit 1: {a.returncode}")
    text = open(f"{tmp}/worker-dup.log").read()
    check('worker name "dup" is taken' in text, f"the woken worker's log: {text}")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    check(c.poll() is None, "the worker that holds the name exited")


def case_queue_worker_name_taken(tmp):
    """Redis only: stateless workers of one --name. One started while
    another of its name runs sees it renew its record and exits 1 without
    leasing anything; one started right after a kill -9 of the old process
    waits one renewal, sees none and takes the name; of two started at the
    same moment, one stops with the error and the other runs on, and every
    job finishes once; one frozen while a new process took its name, then
    woken, runs on and the later process stops. (Before, they overwrote one
    record in the roster, so spindle workers showed one, and the first to
    stop removed it.)"""
    check(BACKEND == "redis", "this case needs --backend redis")
    p, ep = start_serve(tmp, "--workers", "0")
    url = REDIS["url"]

    def table():
        r = json.loads(cli("workers", "--json", "--connect", ep, check_rc=0).stdout)
        return {w["name"]: w for w in r["workers"] if not w.get("gone")}

    def refused(w, log, what, why="is taken by another worker process on the queue"):
        try:
            rc = w.wait(30)
        except subprocess.TimeoutExpired:
            raise Fail(f"{what} still runs after 30 s: {open(f'{tmp}/{log}').read()}")
        text = open(f"{tmp}/{log}").read()
        check(rc == 1 and why in text and "give each worker its own --name" in text, f"{what}: exit {rc}; {text}")
        return text
    a = start_worker(tmp, url, name="qdup")
    wait_for(lambda: "worker:qdup" in table(), 15, "the first worker to be listed")
    inst = table()["worker:qdup"]["instance"]
    b = start_worker(tmp, url, name="qdup", log="qdup-2.log")
    text = refused(b, "qdup-2.log", "a second worker named qdup")
    check("waiting up to" in text and "leasing from" not in text, f"it should not lease: {text}")
    check(a.poll() is None and table()["worker:qdup"]["instance"] == inst, f"the first keeps its name: {table()}")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    # killed: a new process of its name takes it after one renewal time
    a.kill()
    a.wait()
    c = start_worker(tmp, url, name="qdup", log="qdup-3.log")
    wait_for(lambda: table().get("worker:qdup", {}).get("instance") not in (None, inst), 20,
             "the restarted worker to take the name")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    time.sleep(6)  # another roster renewal: it keeps the name
    check(c.poll() is None, "the restarted worker exited: " + open(f"{tmp}/qdup-3.log").read())
    c.send_signal(signal.SIGTERM)
    check(c.wait(20) == 0, f"the restarted worker exited {c.returncode} after SIGTERM")
    # two at once: one stops, one runs on; the jobs all finish once
    os.mkdir(f"{tmp}/out")
    make_file(f"{tmp}/in.bin", 40_000, 43)  # 10 chunks of 4 KiB
    pair = [start_worker(tmp, url, "--chunk-bytes", "4096", "--exec-log", f"{tmp}/exec.log", name="qpair",
                         log=f"qpair-{i}.log") for i in (0, 1)]
    ids = submit_many(ep, tmp, 20, 10, f"{tmp}/out")
    wait_for(lambda: any(w.poll() is not None for w in pair), 30, "one of two workers named qpair to stop")
    i = 0 if pair[0].poll() is not None else 1
    refused(pair[i], f"qpair-{i}.log", "the worker of the pair that stopped")
    wait_all(ep, ids, 60)
    done = exec_counts(f"{tmp}/exec.log", "done")
    check(sorted(done) == sorted(ids) and set(done.values()) == {1}, f"each job done once: {done}")
    check(pair[1 - i].poll() is None, "both workers of the pair stopped: " + open(f"{tmp}/qpair-{1 - i}.log").read())
    pair[1 - i].send_signal(signal.SIGTERM)
    check(pair[1 - i].wait(20) == 0, "the worker of the pair that ran on, after SIGTERM")
    # frozen past a renewal: a new process takes the name; woken, the old
    # one (it started first) runs on and the new one stops
    old = start_worker(tmp, url, name="qfrozen")
    wait_for(lambda: "worker:qfrozen" in table(), 15, "worker qfrozen to be listed")
    inst = table()["worker:qfrozen"]["instance"]
    old.send_signal(signal.SIGSTOP)
    try:
        new = start_worker(tmp, url, name="qfrozen", log="qfrozen-2.log")
        wait_for(lambda: table().get("worker:qfrozen", {}).get("instance") not in (None, inst), 20,
                 "the new worker to take the name of the frozen one")
    finally:
        old.send_signal(signal.SIGCONT)
    refused(new, "qfrozen-2.log", "the new worker once the old one woke",
            "is taken by another worker process on the queue, started before this one")
    text = open(f"{tmp}/worker-qfrozen.log").read()
    check("another worker process, started later, uses this name" in text, f"the old worker's log: {text}")
    wait_for(lambda: table().get("worker:qfrozen", {}).get("instance") == inst, 15, "the old worker's record back")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    check(old.poll() is None, "the woken worker exited: " + text)


def case_watch_gateway_restart(tmp):
    """spindle watch follows a job across a gateway's kill -9 and restart,
    saying that the gateway does not answer and when it does again, and
    ends with the job (exit 0); without a gateway it gives up after
    --gateway-wait with an error that says where the job was (exit 5).
    (Before, it waited silently for hours.)"""
    args = ["--workers", "1", "--chunk-bytes", "4096", "--lease-ms", "1500"]
    p, ep = start_serve(tmp, *args)
    make_file(f"{tmp}/in.bin", 200_000, 17)  # 49 chunks
    jid = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/o.bin",
                  "--param", "chunk_delay_ms=60", "--connect", ep, check_rc=0).stdout.split()[0])
    err = open(f"{tmp}/watch.err", "wb")
    w = subprocess.Popen([SPINDLE, "watch", str(jid), "--connect", ep, "--timeout-ms", "500"],
                         stdout=subprocess.PIPE, stderr=err)
    PROCS.append(w)
    # the Python sample client follows it the same way
    py = os.path.join(os.environ.get("SPINDLE_SOURCE_ROOT", "."), "samples", "python", "client.py")
    pyw = subprocess.Popen([sys.executable, py, "--connect", ep, "--timeout-ms", "500", "watch", str(jid)],
                           stdout=subprocess.PIPE, stderr=open(f"{tmp}/pywatch.err", "wb"))
    PROCS.append(pyw)
    wait_for(lambda: status(ep, jid)["done"] >= 5, 20, "the job to run")
    # and the C sample, on the client library (its silence takes two 10 s timeouts to notice)
    cw = None
    if SAMPLE_C:
        cw = subprocess.Popen([SAMPLE_C, ep, "copy", f"in={tmp}/in.bin", f"out={tmp}/c.bin"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        PROCS.append(cw)
        wait_for(lambda: cli("status", str(jid + 1), "--connect", ep).returncode == 0, 20, "the C sample's job")
    p.kill()
    p.wait()
    wait_for(lambda: b"no answer from the gateway at " + ep.encode() in open(f"{tmp}/watch.err", "rb").read(), 15,
             "watch to say that the gateway does not answer")
    wait_for(lambda: b"no answer from the gateway for " in open(f"{tmp}/pywatch.err", "rb").read(), 15,
             "the Python client to say that the gateway does not answer")
    check(w.poll() is None and pyw.poll() is None, "a watch stopped while the gateway was away")
    port = ep.rsplit(":", 1)[1]
    p, ep = start_serve(tmp, *args, bind=f"tcp://127.0.0.1:{port}")
    out, _ = w.communicate(timeout=90)
    text = open(f"{tmp}/watch.err").read()
    check(w.returncode == 0 and out.decode().strip() == f"{jid} succeeded" and
          f"the gateway at {ep} answers again" in text, f"watch: exit {w.returncode}, {out!r}, {text}")
    out, _ = pyw.communicate(timeout=90)
    text = open(f"{tmp}/pywatch.err").read()
    check(pyw.returncode == 0 and out.decode().strip() == f"{jid} succeeded" and
          "the gateway answers again" in text, f"client.py watch: exit {pyw.returncode}, {out!r}, {text}")
    if cw:
        out, errb = cw.communicate(timeout=90)
        check(cw.returncode == 0 and f"job {jid + 1} finished: succeeded" in out.decode(),
              f"the C sample across the restart: exit {cw.returncode}, {out!r} {errb!r}")
    check(same(f"{tmp}/in.bin", f"{tmp}/o.bin"), "output")
    # no gateway comes back: watch gives up after --gateway-wait
    jid = int(cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/o2.bin",
                  "--param", "chunk_delay_ms=60", "--connect", ep, check_rc=0).stdout.split()[0])
    wait_for(lambda: status(ep, jid)["done"] >= 5, 20, "the second job to run")
    w = subprocess.Popen([SPINDLE, "watch", str(jid), "--connect", ep, "--timeout-ms", "500",
                          "--gateway-wait", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    PROCS.append(w)
    pyw = subprocess.Popen([sys.executable, py, "--connect", ep, "--timeout-ms", "500", "--gateway-wait", "3",
                            "watch", str(jid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    PROCS.append(pyw)
    # both have heard from the gateway once before it goes (a slow start would
    # otherwise find no gateway at all, which is another case)
    early = read_until(w.stderr, f"job {jid}: running".encode(), 20)
    pyearly = read_until(pyw.stderr, f"job {jid}".encode(), 20)
    p.kill()
    p.wait()
    try:
        out, errb = w.communicate(timeout=30)
        _, pyerr = pyw.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        raise Fail("watch did not give up within 30 s with --gateway-wait 3")
    errb, pyerr = early + errb, pyearly + pyerr
    check(w.returncode == 5 and f"job {jid}: gave up after " in errb.decode() and "was running when it last answered"
          in errb.decode() and f"spindle watch {jid}" in errb.decode(), f"watch: exit {w.returncode}, {errb!r}")
    check(pyw.returncode == 5 and f"job {jid}: gave up after " in pyerr.decode() and f"watch {jid} follows it again"
          in pyerr.decode(), f"client.py watch --gateway-wait 3: exit {pyw.returncode}, {pyerr!r}")


def hang_config(tmp):
    """synth -> hang (the test stage of tests/runtime/xfer: the call given
    the frame of seq `at`, a job param, never returns) -> filesink."""
    with open(f"{tmp}/hang.toml", "w") as f:
        f.write('[pipeline]\nname = "hang"\n[pipeline.outputs]\nframes = "sink.path"\n'
                '[pipeline.params]\nat = "stuck.at"\n'
                '[[stage]]\nname = "source"\nkind = "synth"\nframes = 5\nwidth = 8\nheight = 8\n'
                '[[stage]]\nname = "stuck"\nkind = "hang"\ninputs = ["source"]\n'
                '[[stage]]\nname = "sink"\nkind = "filesink"\ninputs = ["stuck"]\n')
    with open(f"{tmp}/hsrv.toml", "w") as f:
        f.write('[server]\ndevices = "cpu"\ncancel_grace_s = 2\n[[pipeline]]\nname = "hang"\nconfig = "hang.toml"\n')
    return f"{tmp}/hsrv.toml"


def case_stuck(tmp):
    """A stage stuck inside a call for good (the hang test stage) no longer
    holds its job and its worker for ever: once stopped (its timeout, a
    cancel), a run still inside the call after the cancel grace (2 s here)
    is abandoned; the job fails naming the pipeline and the stage, and the
    process takes no more jobs: the gateway's own slots stop (its /healthz
    answers 503, remote workers go on, SIGTERM still stops it at once), a
    remote or stateless worker exits 1 saying why. (Before, the job stayed
    running and its worker busy until someone killed the process.)"""
    xfer = os.environ.get("SPINDLE_XFER_PLUGIN_DIR")
    check(xfer, "SPINDLE_XFER_PLUGIN_DIR is not set (the hang test stage)")
    # a wedged process leaves its runtime to the exit: nothing to report as leaked
    os.environ["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    cfg = hang_config(tmp)
    os.mkdir(f"{tmp}/out")
    port = free_port()
    p, ep = start_serve(tmp, "--config", cfg, "--workers", "1", "--plugin-path", xfer, "--http", f"127.0.0.1:{port}",
                        "--max-attempts", "1")
    cli("submit", "hang", "--output", f"frames={tmp}/out/ok.raw", "--wait", "--connect", ep, timeout=30, check_rc=0)
    t0 = time.monotonic()
    r = cli("submit", "hang", "--output", f"frames={tmp}/out/stuck.raw", "--param", "at=2", "--timeout", "1",
            "--wait", "--connect", ep, timeout=30)
    took = time.monotonic() - t0
    st = status(ep, int(r.stdout.split()[0]))
    err = st["errors"][0]["error"] if st.get("errors") else ""
    check(r.returncode == 1 and st["state"] == "failed" and "timed out after 1 s (its timeout)" in err and
          'pipeline "hang" did not stop within 2 s' in err and 'stage "stuck" is inside one call' in err and
          "takes no more jobs" in err and took < 15,
          f"a job stuck in a call: exit {r.returncode} after {took:.1f} s, {st}")
    check(not os.path.exists(f"{tmp}/out/stuck.raw"), "the abandoned job published its output")
    code, body = http_get(port, "/healthz")
    check(code == 503 and body.startswith("wedged: ") and 'stage "stuck"' in body, f"/healthz: {code} {body!r}")
    # the gateway's slot takes nothing more; a remote worker does
    r = cli("submit", "hang", "--output", f"frames={tmp}/out/later.raw", "--connect", ep, check_rc=0)
    later = int(r.stdout.split()[0])
    # ... and no longer counts as a worker of the pipeline: the job says it waits for one
    wait_for(lambda: "waiting" in status(ep, later), 25, "the queued job's status to say it waits for a worker")
    check(status(ep, later)["state"] == "queued", f"a wedged gateway's slot took a job: {status(ep, later)}")
    rows = json.loads(cli("workers", "--json", "--connect", ep, check_rc=0).stdout)["workers"]
    check(any(w["kind"] == "local" and w["draining"] for w in rows), f"spindle workers: {rows}")
    if BACKEND == "redis":
        where, how = REDIS["url"], "stateless worker"
    else:
        where, how = ep, "remote worker"
    w = start_worker(tmp, where, "--config", cfg, "--plugin-path", xfer, "--slots", "2", name="hw")
    wait_for(lambda: status(ep, later)["state"] == "succeeded", 30, f"the {how} to run the queued job")
    # the worker stuck the same way, stopped by a cancel: it fails the job and exits 1
    r = cli("submit", "hang", "--output", f"frames={tmp}/out/w.raw", "--param", "at=1", "--connect", ep, check_rc=0)
    jid = int(r.stdout.split()[0])
    wait_for(lambda: status(ep, jid)["state"] == "running", 20, "the job to run on the worker")
    time.sleep(0.5)
    cli("cancel", str(jid), "--connect", ep, check_rc=0)
    # until its run has stopped (2 s of grace here), the job still holds its output
    e = cli("submit", "hang", "--output", f"frames={tmp}/out/w.raw", "--connect", ep, check_rc=5).stderr.decode()
    check(f"is the output of job {jid}, which is being cancelled but still runs" in e and
          f"spindle watch {jid}" in e, f"a job on the output of a job being cancelled: {e}")
    try:
        rc = w.wait(30)
    except subprocess.TimeoutExpired:
        raise Fail(f"the {how} still runs 30 s after its job was cancelled: " + open(f"{tmp}/worker-hw.log").read())
    log = open(f"{tmp}/worker-hw.log").read()
    check(rc == 1 and "worker stopped: " in log and 'pipeline "hang" did not stop within 2 s' in log and
          'stage "stuck"' in log, f"the {how}: exit {rc}: {log}")
    wait_for(lambda: status(ep, jid)["state"] in ("cancelled", "failed"), 20, "the cancelled job to end")
    check(status(ep, jid)["state"] == "cancelled", f"the stuck job after its cancel: {status(ep, jid)}")
    # a wedged gateway still stops at once on SIGTERM (its runtime is left to the exit)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(15)
    except subprocess.TimeoutExpired:
        raise Fail("a wedged gateway did not stop within 15 s of SIGTERM")
    check(rc == 0, f"a wedged gateway exited {rc} after SIGTERM")


def case_timeout(tmp):
    """--timeout bounds each attempt: a copy that needs ~2 s with a 0.5 s
    limit is stopped, its partial output removed, and fails "timed out after
    0.5 s" once per attempt (dead after 2); one within its limit succeeds; the
    server's --job-timeout applies to a job that gives none and a job's own
    overrides it; a remote worker enforces it too; bad values are refused
    naming the field. (Before, nothing bounded a run.)"""
    p, ep = start_serve(tmp, "--workers", "1", "--job-timeout", "30", "--chunk-bytes", "4096",
                        "--backoff-ms", "50")
    make_file(f"{tmp}/in.bin", 40_000, 5)  # 10 chunks
    os.mkdir(f"{tmp}/out")

    def copy(out, *extra):
        r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out/{out}",
                "--param", "chunk_delay_ms=200", *extra, "--wait", "--connect", ep, timeout=60)
        return r, status(ep, int(r.stdout.split()[0]))
    t0 = time.monotonic()
    r, st = copy("slow.bin", "--timeout", "0.5", "--max-attempts", "2")
    took = time.monotonic() - t0
    errs = [e["error"] for e in st.get("errors", [])]
    check(r.returncode == 4 and st["state"] == "dead" and st["attempts"] == 2 and len(errs) == 2 and
          all(f"job {st['id']}: timed out after 0.5 s (its timeout)" in e for e in errs) and
          st["spec"]["timeout"] == 0.5 and st["done"] < st["total"] and took < 10,
          f"a job over its timeout: exit {r.returncode} after {took:.1f} s, {st}")
    check(os.listdir(f"{tmp}/out") == [], f"a timed-out job left files: {os.listdir(tmp + '/out')}")
    # within its limit (and the server's 30 s default applies, visible in its spec)
    r, st = copy("ok.bin")
    check(r.returncode == 0 and st["spec"]["timeout"] == 30 and same(f"{tmp}/in.bin", f"{tmp}/out/ok.bin"),
          f"a job within the server's timeout: exit {r.returncode}, {st}")
    # a remote worker enforces it the same way
    p2, ep2 = start_serve(tmp, "--workers", "0", "--chunk-bytes", "4096", db="q2.db", log="serve2.log")
    start_worker(tmp, ep2, "--chunk-bytes", "4096", name="rw")
    r = cli("submit", "copy", "--input", f"in={tmp}/in.bin", "--output", f"out={tmp}/out/remote.bin",
            "--param", "chunk_delay_ms=200", "--timeout", "0.5", "--max-attempts", "1", "--wait", "--connect", ep2,
            timeout=60)
    st = status(ep2, int(r.stdout.split()[0]))
    check(r.returncode == 1 and st["state"] == "failed" and "timed out after 0.5 s" in st["errors"][0]["error"],
          f"a remote worker's job over its timeout: exit {r.returncode}, {st}")
    # the Python sample client passes it on
    py = os.path.join(os.environ.get("SPINDLE_SOURCE_ROOT", "."), "samples", "python", "client.py")
    r = subprocess.run([sys.executable, py, "--connect", ep, "submit", "copy", "--input", f"in={tmp}/in.bin",
                        "--output", f"out={tmp}/out/py.bin", "--param", "chunk_delay_ms=200", "--timeout", "0.3",
                        "--max-attempts", "1", "--wait"], capture_output=True, timeout=60)
    jid = int(r.stdout.split()[0])
    st = status(ep, jid)
    check(r.returncode == 1 and r.stdout.split()[-1] == b"failed" and st["max_attempts"] == 1 and
          "timed out after 0.3 s" in st["errors"][0]["error"], f"client.py --timeout: {r.returncode} {r.stdout!r} {st}")
    st2 = status(ep2, int(cli("submit", "noop", "--connect", ep2, check_rc=0).stdout.split()[0]))
    check("timeout" not in st2["spec"], f"no server default, no job timeout: {st2['spec']}")
    for bad in ("0", "-1", "x", "700000"):
        r = cli("submit", "noop", "--timeout", bad, "--connect", ep)
        check(r.returncode in (2, 5) and b"timeout" in r.stderr, f"--timeout {bad}: exit {r.returncode} {r.stderr!r}")
    r = cli("submit", "noop", "--timeout", "700000", "--connect", ep)
    check(r.returncode == 2 and b"--timeout '700000': expected seconds in (0, 604800]" in r.stderr,
          f"--timeout 700000 (refused by spindle submit): {r.stderr!r}")
    # and by the gateway, from a client that does not check
    ctx = zmq.Context()
    c = Raw(ctx, ep)
    c.req("SUBMIT", {"req": 1, "pipeline": "noop", "timeout": 700000})
    m = c.recv(5000)
    c.close()
    ctx.term()
    check(m and m[0] == "ERROR" and m[1]["code"] == "invalid" and
          m[1]["message"] == 'SUBMIT: "timeout" must be seconds in (0, 604800] (7 days)', f"timeout 700000: {m}")


def case_worker_no_gateway(tmp):
    """A remote worker started before its gateway, on a port where nothing
    listens, says after 5 heartbeats that the gateway does not answer, and
    is not ready (/readyz 503, spindle_worker_gateway_up 0); once a gateway
    listens there it says so, is ready, and runs jobs. A gateway killed
    later is a second silence, said again. (Before, it logged "worker
    connected to" at start and nothing more, whatever was there.)"""
    hp, port = free_port(), free_port()
    ep = f"tcp://127.0.0.1:{port}"
    w = start_worker(tmp, ep, "--heartbeat-ms", "200", "--http", f"127.0.0.1:{hp}", name="early")
    log = f"{tmp}/worker-early.log"
    wait_for(lambda: os.path.exists(log) and "no answer from the gateway at " + ep in open(log).read(), 15,
             "the worker to say that the gateway does not answer")
    text = open(log).read()
    check("connecting to " + ep in text and "connected: " not in text and "--server-key-file" in text, text)
    t = text.split("no answer from the gateway at " + ep + " for ")[1].split(" s:")[0]
    check(5 <= int(t) <= 7, f"said after 5 heartbeats, at least 5 s: {t} s")

    def gauge():
        m = [l for l in http_get(hp, "/metrics")[1].splitlines() if l.startswith("spindle_worker_gateway_up ")]
        return int(m[0].split()[1]) if m else None
    check(http_get(hp, "/readyz") == (503, "no answer from the gateway\n") and gauge() == 0,
          f"not ready while the gateway does not answer: {http_get(hp, '/readyz')}, {gauge()}")
    p, _ = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "200", bind=ep)
    wait_for(lambda: http_get(hp, "/readyz")[0] == 200, 10, "the worker to be ready once the gateway answers")
    check(gauge() == 1 and "connected: the gateway at " + ep + " answers after " in open(log).read(),
          f"gauge {gauge()}; {open(log).read()}")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)
    p.kill()
    p.wait()
    wait_for(lambda: open(log).read().count("no answer from the gateway at ") == 2, 15,
             "the worker to say the second silence")
    check(gauge() == 0 and w.poll() is None, f"gauge {gauge()}, worker exit {w.poll()}")
    p, _ = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "200", bind=ep)
    wait_for(lambda: "the gateway at " + ep + " answers again (after " in open(log).read(), 15,
             "the worker to say that the gateway answers again")
    cli("submit", "noop", "--wait", "--connect", ep, timeout=30, check_rc=0)


def case_sqlite_one_gateway(tmp):
    """SQLite: a second gateway on the queue file of a running one stops at
    once with an error naming the first (its remote workers, watchers and
    presence live in the first one's memory); the first goes on serving.
    Once the first is killed (-9), a gateway starts on the file and runs
    the job queued meanwhile."""
    check(BACKEND == "sqlite", "this case is about the SQLite backend")
    p, ep = start_serve(tmp, "--workers", "0")
    r = subprocess.run([SPINDLE, "serve", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/q.db", "--root", tmp,
                        "--workers", "1"], capture_output=True, timeout=20, cwd=tmp)
    err = r.stderr.decode()
    check(r.returncode == 1 and f"job queue {tmp}/q.db: another gateway ({socket.gethostname()}:{p.pid}) serves it"
          in err and "--queue redis://" in err and b"ready on" not in r.stdout,
          f"the second gateway: exit {r.returncode}; {r.stdout!r} {err}")
    jid = int(cli("submit", "noop", "--connect", ep, check_rc=0).stdout.split()[0])
    check(status(ep, jid)["state"] == "queued", f"the first gateway (no workers) keeps the job: {status(ep, jid)}")
    p.kill()
    p.wait()
    p2, ep2 = start_serve(tmp, "--workers", "1")
    cli("watch", str(jid), "--connect", ep2, timeout=30, check_rc=0)


def case_workers_gone(tmp):
    """SQLite: a remote worker lost without draining (kill -9) is listed by
    spindle workers as gone, and counted in spindle_queue_workers; one that
    drained is not listed; the lost one back under its name is live again."""
    port = free_port()
    p, ep = start_serve(tmp, "--workers", "0", "--heartbeat-ms", "300", "--http", f"127.0.0.1:{port}")
    r1 = start_worker(tmp, ep, "--slots", "2", "--heartbeat-ms", "300", name="r1")
    r2 = start_worker(tmp, ep, "--slots", "1", "--heartbeat-ms", "300", name="r2")

    def table():
        r = json.loads(cli("workers", "--json", "--connect", ep, check_rc=0).stdout)
        names = [w["name"] for w in r["workers"]]
        check(len(names) == len(set(names)), f"a worker listed twice: {r}")
        return {w["name"]: w for w in r["workers"]}

    def metric():
        text = http_get(port, "/metrics")[1]
        return {l.split("{")[1].split("}")[0]: int(l.split()[-1]) for l in text.splitlines()
                if l.startswith("spindle_queue_workers{")}
    wait_for(lambda: set(table()) == {"remote:r1", "remote:r2"}, 10, "both remote workers to be listed")
    check(metric()['kind="remote",state="live"'] == 2, f"spindle_queue_workers: {metric()}")
    r1.kill()
    r1.wait()
    r2.send_signal(signal.SIGTERM)
    check(r2.wait(20) == 0, f"worker r2 exited {r2.returncode} after SIGTERM")
    wait_for(lambda: set(table()) == {"remote:r1"} and table()["remote:r1"].get("gone"), 10,
             "the killed worker to be listed as gone, the drained one not at all")
    w = table()["remote:r1"]
    check(w["slots"] == 2 and w["running"] == 0 and "copy" in w["pipelines"] and 900 <= w["last_heard_ms"] < 10000,
          f"the gone worker's row: {w}")
    m = metric()
    check(m['kind="remote",state="gone"'] == 1 and sum(m.values()) == 1, f"spindle_queue_workers: {m}")
    lines = cli("workers", "--connect", ep, check_rc=0).stdout.decode().splitlines()
    check(any(l.startswith("remote:r1 ") and "(gone: last heard " in l for l in lines), f"spindle workers: {lines}")
    # a new worker does not take the gone one's place in the list
    start_worker(tmp, ep, "--slots", "1", "--heartbeat-ms", "300", name="r3")
    wait_for(lambda: "remote:r3" in table(), 10, "worker r3 to be listed")
    check(table()["remote:r1"]["gone"] and len(table()) == 2, f"r1 still gone beside r3: {table()}")
    start_worker(tmp, ep, "--slots", "3", "--heartbeat-ms", "300", name="r1")
    wait_for(lambda: not table().get("remote:r1", {}).get("gone", True), 10, "worker r1, back, to be live")
    check(table()["remote:r1"]["slots"] == 3 and len(table()) == 2, f"r1 back: {table()}")
    m = metric()
    check(m['kind="remote",state="live"'] == 2 and sum(m.values()) == 2, f"spindle_queue_workers: {m}")


def case_workers_roster(tmp):
    """Redis only: spindle workers on one gateway lists every worker of the
    shared queue, whoever it leases through: another gateway's own slots,
    that gateway's remote worker (via it), stateless workers. A worker that
    drains leaves the list; one killed, and a gateway killed, are listed as
    gone. (Before, it named only the asking gateway's own workers.)"""
    check(BACKEND == "redis", "this case needs --backend redis")
    port = free_port()
    pa, epa = start_serve(tmp, "--workers", "0", "--http", f"127.0.0.1:{port}")
    pb, epb = start_serve(tmp, "--workers", "2", "--heartbeat-ms", "300", db="q2.db", log="b.log")

    def metric():
        # spindle_queue_workers on gateway A: every worker of the queue
        text = http_get(port, "/metrics")[1]
        return {l.split("{")[1].split("}")[0]: int(l.split()[-1]) for l in text.splitlines()
                if l.startswith("spindle_queue_workers{")}
    gw_a, gw_b = f"{socket.gethostname()}:{pa.pid}", f"{socket.gethostname()}:{pb.pid}"
    rb = start_worker(tmp, epb, "--slots", "3", "--heartbeat-ms", "300", name="rb")
    q1 = start_worker(tmp, REDIS["url"], "--slots", "1", name="q1")
    q2 = start_worker(tmp, REDIS["url"], "--slots", "2", name="q2")

    def table():
        r = json.loads(cli("workers", "--json", "--connect", epa, check_rc=0).stdout)
        check(r.get("gateway") == gw_a, f"WORKERS names the gateway that answered: {r}")
        return {w["name"]: w for w in r["workers"]}
    everyone = {gw_b, "remote:rb", "worker:q1", "worker:q2"}
    wait_for(lambda: set(table()) == everyone, 15, f"gateway A to list {sorted(everyone)}")
    t = table()
    want = {gw_b: ("local", 2, gw_b), "remote:rb": ("remote", 3, gw_b), "worker:q1": ("queue", 1, None),
            "worker:q2": ("queue", 2, None)}
    for name, (kind, slots, gw) in want.items():
        w = t[name]
        check((w["kind"], w["slots"], w.get("gateway"), w["running"], w["gone"], w["draining"])
              == (kind, slots, gw, 0, False, False) and "copy" in w["pipelines"]
              and w["last_heard_ms"] < 15000, f"gateway A's row of {name}: {w}")
    lines = cli("workers", "--connect", epa, check_rc=0).stdout.decode().splitlines()
    row = {l.split()[0]: l for l in lines[1:] if l.strip() and not l.startswith("PIPELINE")}
    check(row[gw_b].split()[1:4] == ["local", "2", "0"] and row[gw_b].endswith("(another gateway)"),
          f"spindle workers, gateway B's slots: {lines}")
    check(row["remote:rb"].split()[1:4] == ["remote", "3", "0"] and row["remote:rb"].endswith(f"(via {gw_b})"),
          f"spindle workers, B's remote worker: {lines}")
    check(row["worker:q1"].split()[1:4] == ["queue", "1", "0"] and "(" not in row["worker:q1"],
          f"spindle workers, a stateless worker: {lines}")
    m = metric()
    check(m['kind="local",state="live"'] == 1 and m['kind="remote",state="live"'] == 1
          and m['kind="queue",state="live"'] == 2 and sum(m.values()) == 4, f"spindle_queue_workers: {m}")
    # gateway B lists A's nothing (A has no slots) and its own remote worker
    rb_seen = json.loads(cli("workers", "--json", "--connect", epb, check_rc=0).stdout)
    names_b = sorted(w["name"] for w in rb_seen["workers"])
    check(names_b == sorted(["(this gateway)", "remote:rb", "worker:q1", "worker:q2"]), f"gateway B's list: {names_b}")
    # a stateless worker and a remote worker stop cleanly: they leave the list
    for p in (q2, rb):
        p.send_signal(signal.SIGTERM)
    for p in (q2, rb):
        check(p.wait(20) == 0, f"{' '.join(p.args[:4])} exited {p.returncode} after SIGTERM")
    wait_for(lambda: set(table()) == {gw_b, "worker:q1"}, 10, "the drained workers to leave A's list")
    # a stateless worker and a gateway killed: listed as gone, then a while later
    # (SPN_ROSTER_KEEP_MS) removed
    for p in (q1, pb):
        p.kill()
        p.wait()
    t0 = time.monotonic()
    wait_for(lambda: all(w["gone"] for w in table().values()), 25, "the killed worker and gateway to show as gone")
    t = table()
    check(set(t) == {gw_b, "worker:q1"} and 15000 < t["worker:q1"]["last_heard_ms"] < 30000,
          f"after kill -9, gone ({time.monotonic() - t0:.1f} s): {t}")
    lines = cli("workers", "--connect", epa, check_rc=0).stdout.decode().splitlines()
    check(any(l.startswith("worker:q1 ") and "(gone: last heard " in l for l in lines), f"spindle workers: {lines}")
    m = metric()
    check(m['kind="local",state="gone"'] == 1 and m['kind="queue",state="gone"'] == 1 and sum(m.values()) == 2,
          f"spindle_queue_workers after kill -9 of a worker and a gateway: {m}")


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    global SPINDLE
    global SAMPLE_C
    global BACKEND
    argv = sys.argv[1:]
    if "--backend" in argv:
        i = argv.index("--backend")
        BACKEND = argv[i + 1]
        del argv[i:i + 2]
    SPINDLE = os.path.abspath(argv[0])
    names = argv[1:2] or list(CASES)
    SAMPLE_C = os.path.abspath(argv[2]) if len(argv) > 2 else None
    if BACKEND == "redis" and not shutil.which("redis-server"):
        print("redis-server is not installed (Debian package redis-server): skipped")
        return 77
    passed = failed = 0
    for name in names:
        tmp = tempfile.mkdtemp(prefix=f"spn-jobs-{name}-")
        t0 = time.monotonic()
        try:
            CASES[name](tmp)
            passed += 1
            CASE_OK[name] = True
            print(f"ok {name} ({time.monotonic() - t0:.1f}s)")
        except Exception as e:
            failed += 1
            print(f"FAIL {name}: {e}")
            traceback.print_exc()
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log") and f != "exec.log":
                    print(f"--- {f}\n" + open(os.path.join(tmp, f), errors="replace").read()[-3000:])
        finally:
            # Processes still running must stop cleanly on SIGINT (exit 0:
            # under ASan that also means no leak or error report). SIGINT
            # stops at once; SIGTERM would drain running jobs first.
            live = [p for p in PROCS if p.poll() is None]
            for p in live:
                p.send_signal(signal.SIGINT)
            unclean = []
            for p in live:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                if p.returncode != 0:
                    unclean.append(f"{' '.join(p.args[:2])} exited {p.returncode} after SIGTERM")
            PROCS.clear()
            REDIS.clear()
            if unclean:
                if True:
                    print(f"FAIL {name}: " + "; ".join(unclean))
                    for f in sorted(os.listdir(tmp)):
                        if f.endswith(".log") and f != "exec.log":
                            print(f"--- {f}\n" + open(os.path.join(tmp, f), errors="replace").read()[-3000:])
                    # count the case as failed once
                    if passed and CASE_OK.get(name):
                        passed -= 1
                    failed += 1
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
