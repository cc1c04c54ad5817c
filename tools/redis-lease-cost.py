#!/usr/bin/env python3
"""What an idle worker costs Redis while jobs it does not run wait.

usage: tools/redis-lease-cost.py SPINDLE SOURCE_ROOT N [SECONDS] [--rebuild]

Starts redis-server on a free loopback port, a gateway (no workers of its
own) on it with the synthetic pipeline, submits N synthetic jobs, then one
stateless worker that loads no pipeline (only the built-in test ones: it
can run none of the N). It prints Redis' own count of the scripts run and
their time (INFO commandstats, reset after the worker started) over
SECONDS (10): every lease the worker polls for, its sweeps and renewals.

With --rebuild it then deletes the pipelines' ready sets and the waiting
mirror (as a queue that an older Spindle wrote has neither), waits until the
sweeps have rebuilt them from the N queued jobs, and prints how long that
took and the longest any one script held Redis (SLOWLOG; Redis answers no
other command while a script runs). It fails if either was not rebuilt.
Needs redis-server, redis-cli and pyzmq; the stages of stages/util on
SPINDLE_PLUGIN_PATH when SPINDLE is a build tree's.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zmq


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    rebuild = "--rebuild" in sys.argv
    if rebuild:
        sys.argv.remove("--rebuild")
    spindle, src, n = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), int(sys.argv[3])
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        print("redis-server is not installed (Debian package redis-server): skipped")
        return 77
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    tmp = tempfile.mkdtemp(prefix="spn-lease-cost-")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "common"))
    from freeport import free_port  # below the ephemeral range: no port races with the tests beside it
    port = free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--dir", tmp], stdout=subprocess.DEVNULL))
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}"

        def redis(*args):
            return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout

        with open(f"{tmp}/server.toml", "w") as f:
            f.write(f'[server]\ndevices = "cpu"\n[[pipeline]]\nname = "synthetic"\n'
                    f'config = "{src}/configs/synthetic-job.toml"\n')
        gw = subprocess.Popen([spindle, "serve", "--config", f"{tmp}/server.toml", "--bind", "tcp://127.0.0.1:*",
                               "--workers", "0", "--queue", url, "--root", tmp, "--db", f"{tmp}/q.db"],
                              stdout=subprocess.PIPE, stderr=open(f"{tmp}/serve.log", "w"), cwd=tmp)
        procs.append(gw)
        ep = gw.stdout.readline().decode().split("ready on ")[1].strip()
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.connect(ep)
        for i in range(n):
            body = {"req": i + 1, "pipeline": "synthetic", "outputs": {"frames": f"{tmp}/{i}.raw"}}
            d.send_multipart([b"", b"SPN1", b"SUBMIT", json.dumps(body).encode()])
        for _ in range(n):
            d.recv_multipart()
        d.close(0)
        ctx.term()
        procs.append(subprocess.Popen([spindle, "worker", "--queue", url, "--name", "idle", "--slots", "1"],
                                      stdout=open(f"{tmp}/worker.log", "w"), stderr=subprocess.STDOUT, cwd=tmp))
        time.sleep(2)
        redis("CONFIG", "RESETSTAT")
        time.sleep(seconds)
        stats = {}
        for line in redis("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_evalsha:"):
                stats = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
        queued = redis("ZCARD", "spindle:st:0").strip()
        calls, usec = int(stats.get("calls", 0)), int(stats.get("usec", 0))
        if queued != str(n) or calls == 0:
            print(f"the worker took a job it cannot run, or ran no script: {queued} of {n} queued, {calls} calls")
            return 1
        print(f"{queued} jobs queued that the worker does not run; over {seconds:.0f} s its scripts ran "
              f"{calls} times, {usec / 1000:.1f} ms of Redis time ({usec / max(calls, 1):.0f} us each), "
              f"{100 * usec / 1e6 / seconds:.2f}% of Redis' core")
        if rebuild:
            redis("CONFIG", "SET", "slowlog-log-slower-than", "0")
            redis("CONFIG", "SET", "slowlog-max-len", "100000")
            redis("SLOWLOG", "RESET")
            redis("DEL", "spindle:ready:synthetic", "spindle:waiting")

            def rebuilt():
                """(entries in the pipeline's set, the mirror's lag) as Redis prints them"""
                info = redis("XINFO", "GROUPS", "spindle:waiting").split()
                return (redis("ZCARD", "spindle:ready:synthetic").strip(),
                        info[info.index("lag") + 1] if "lag" in info else "?")

            # the sweeps (the gateway's, every 0.25 s) rebuild them: 1,000
            # entries of the sets and 10,000 tokens of the mirror each
            t0 = time.monotonic()
            deadline = t0 + max(60.0, n / 1000 * 0.25 * 4)
            while (got := rebuilt()) != (str(n), str(n)) and time.monotonic() < deadline:
                time.sleep(0.1)
            took = time.monotonic() - t0
            if got != (str(n), str(n)):
                print(f"not rebuilt: the pipelines' sets hold {got[0]} of {n} entries, the mirror's lag is {got[1]}")
                return 1
            # SLOWLOG GET entries: id, time, microseconds, [command, args...]
            out = redis("--json", "SLOWLOG", "GET", "100000")
            try:
                entries = json.loads(out)
            except ValueError:
                entries = []
            evals = [e[2] for e in entries if isinstance(e, list) and len(e) > 3 and isinstance(e[3], list)
                     and e[3] and str(e[3][0]).lower() == "evalsha"]
            longest = max(evals) if evals else 0
            if not evals:
                print(f"no script in Redis' SLOWLOG: {out[:300]!r}")
                return 1
            print(f"rebuilding the pipelines' ready sets and the waiting mirror of {n} queued jobs took "
                  f"{took:.1f} s of sweeps; the longest script held Redis {longest / 1000:.1f} ms")
    finally:
        for p in reversed(procs):
            p.send_signal(2)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
