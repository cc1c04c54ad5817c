#!/usr/bin/env python3
"""Strings in protocol bodies: a real `spindle serve` on 127.0.0.1 gets raw
SPN1 frames (pyzmq DEALER) whose JSON is invalid UTF-8 or carries a NUL
(escaped \\u0000, or a raw byte). Each is refused as `bad_json` naming the
byte; none aliases another job or cuts a path; valid non-ASCII passes.

usage: test-proto-strings.py SPINDLE
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

try:
    import zmq
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)


def fail(msg):
    print(f"FAIL: {msg}")
    raise SystemExit(1)


def main():
    spindle = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="spn-proto-strings-")
    log = open(os.path.join(tmp, "serve.log"), "wb")
    p = subprocess.Popen([spindle, "serve", "--bind", "tcp://127.0.0.1:*", "--db", f"{tmp}/q.db", "--root", tmp,
                          "--workers", "1"], stdout=subprocess.PIPE, stderr=log, cwd=tmp)
    try:
        r, _, _ = select.select([p.stdout], [], [], 20)
        line = p.stdout.readline() if r else b""
        if b"ready on " not in line:
            fail(f"serve not ready: {line!r}")
        ep = line.decode().split("ready on ")[1].strip()
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(ep)
        req = [0]

        def send(body):  # body: bytes of the JSON text
            req[0] += 1
            s.send_multipart([b"", b"SPN1", b"SUBMIT", body])
            if not s.poll(5000):
                fail(f"no reply to {body!r}")
            fr = s.recv_multipart()
            return fr[2].decode(), json.loads(fr[3])

        def refused(body, what):
            t, b = send(body)
            if t != "ERROR" or b.get("code") != "bad_json" or what not in b.get("message", ""):
                fail(f"{body!r}: want bad_json ({what}), got {t} {b}")

        # two idempotency keys that differ only after a NUL: both refused, so
        # they can never alias one job
        for key in (b'a\\u0000x', b'a\\u0000y', b'\\u0000'):
            refused(b'{"pipeline": "noop", "idempotency_key": "' + key + b'"}', "\\u0000 in a string at byte")
        t1, b1 = send(b'{"pipeline": "noop", "idempotency_key": "ax"}')
        t2, b2 = send(b'{"pipeline": "noop", "idempotency_key": "ay"}')
        if t1 != "SUBMITTED" or t2 != "SUBMITTED" or b1["id"] == b2["id"] or b1["existed"] or b2["existed"]:
            fail(f"distinct keys: {t1} {b1} / {t2} {b2}")
        # an output path with a NUL is refused, nothing written at its prefix
        out = f"{tmp}/out.bin"
        open(f"{tmp}/in.bin", "wb").write(b"x" * 1000)
        body = ('{"pipeline": "copy", "inputs": {"in": "%s/in.bin"}, "outputs": {"out": "%s\\u0000.evil"}}'
                % (tmp, out)).encode()
        refused(body, "\\u0000 in a string")
        # a NUL in a key, a raw NUL, a raw control byte, inside strings
        refused(b'{"pipeline": "noop", "para\\u0000ms": {}}', "\\u0000")
        refused(b'{"pipeline": "no\x00op"}', "NUL byte in a string at byte 16")
        refused(b'{"pipeline": "no\x01op"}', "control character in a string")
        # invalid UTF-8: a stray continuation byte, an overlong '/', a
        # surrogate encoded in UTF-8, a truncated sequence, above U+10FFFF
        for bad in (b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xff"):
            refused(b'{"pipeline": "noop", "idempotency_key": "k' + bad + b'"}', "invalid UTF-8 at byte 42")
        refused(b'{"pipeline": "noop", "idempotency_key": "\\ud800"}', "unpaired surrogate")
        refused(b'{"pipeline": "noop", "idempotency_key": "\\udc00x"}', "unpaired surrogate")
        refused(b'{"pipeline": "noop", "idempotency_key": "\\ud800\\u0041"}', "unpaired surrogate")
        # valid non-ASCII, escaped or not, and a surrogate pair, pass; an
        # escaped backslash before "u0000" is just text
        for key in ("caf\u00e9".encode(), b"caf\\u00e9x", b"\\ud83d\\ude00", "\U0001F600y".encode(),
                    b"\\\\u0000"):
            t, b = send(b'{"pipeline": "noop", "idempotency_key": "' + key + b'"}')
            if t != "SUBMITTED":
                fail(f"valid key {key!r} refused: {b}")
        t, b = send('{"pipeline": "noop", "idempotency_key": "café"}'.encode())
        if t != "SUBMITTED" or not b["existed"]:
            fail(f"raw and escaped é should name one key: {b}")
        if os.path.exists(out) or any(".spn-" in f for f in os.listdir(tmp)):
            fail(f"files written: {os.listdir(tmp)}")
        if p.poll() is not None:
            fail("gateway died")
        s.close(0)
        ctx.term()
        print("ok")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
