#!/usr/bin/env python3
"""Command-line parsing of every `spindle` subcommand (getopt_long through
spn_cli_next): the user's mistakes get exit 2 and one message that names the
option, and the GNU forms (--name=value, unambiguous prefixes, "--",
options after positionals) mean the same as the long form.

usage: test-cli-args.py SPINDLE SOURCE_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

spindle, src = sys.argv[1], sys.argv[2]
synthetic = os.path.join(src, "configs", "synthetic.toml")
model = os.path.join(src, "models", "espcn-x2.onnx")
failures = []


def run(*args, timeout=60):
    return subprocess.run([spindle, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def expect(args, rc, err=None, out=None):
    r = run(*args)
    ok = r.returncode == rc and (err is None or err in r.stderr) and (out is None or out in r.stdout)
    if not ok:
        failures.append(f"spindle {' '.join(args)}: rc {r.returncode} (want {rc}); "
                        f"stderr {r.stderr.strip()[:300]!r}; want {err!r}; stdout {r.stdout.strip()[:200]!r}")


# unknown options: exit 2, the option named, the help pointer
for cmd in (["serve"], ["worker"], ["submit", "noop"], ["status", "1"], ["watch", "1"], ["cancel", "1"],
            ["jobs"], ["workers"], ["keygen", "k"], ["run", synthetic], ["validate", synthetic], ["plugins"],
            ["model", "inspect", model], ["model", "run", model], ["model", "bench", model],
            ["model", "list"], ["model", "verify"], ["model", "convert-ncnn"]):
    name = " ".join(cmd[:2] if cmd[0] == "model" else cmd[:1])
    expect(cmd + ["--no-such-option"], 2, f"spindle {name}: unknown option '--no-such-option' "
                                          f"(see 'spindle {name} --help')")
    expect((cmd[:2] if cmd[0] == "model" else cmd[:1]) + ["--help"], 0)

# a value missing at the end of the line
for cmd, opt in ((["serve"], "--http"), (["worker"], "--connect"), (["submit", "noop"], "--input"),
                 (["jobs"], "--limit"), (["validate", synthetic], "--set"), (["run", synthetic], "--devices"),
                 (["model", "run", model], "--output-dir"), (["model", "bench", model], "--batch"),
                 (["status", "1"], "--connect")):
    name = " ".join(cmd[:2] if cmd[0] == "model" else cmd[:1])
    expect(cmd + [opt], 2, f"spindle {name}: option '{opt}' needs a value")

# bad values are named
expect(["serve", "--workers", "two"], 2, "--workers needs a non-negative integer")
expect(["serve", "--lease-ms=-1"], 2, "--lease-ms needs a non-negative integer")
expect(["worker", "--slots=x", "--connect", "tcp://127.0.0.1:1"], 2, "--slots needs a non-negative integer")
# a device kind this build has no backend for: the kinds it takes are listed
expect(["run", synthetic, "--devices", "gpu"], 2,
       'devices "gpu": no backend for "gpu" in this build (it takes auto, cpu, cpu:N')
expect(["serve", "--log-level", "loud"], 2, "spindle serve: --log-level 'loud': expected debug, info, warn or error")
expect(["worker", "--log-level=verbose", "--connect", "tcp://127.0.0.1:1"], 2,
       "spindle worker: --log-level 'verbose': expected debug, info, warn or error")
expect(["submit"], 2, "which pipeline?")
expect(["submit", "noop", "other"], 2, 'one pipeline only (also got "other")')
expect(["submit", "noop", "--priority", "high"], 2, '--priority needs an integer, got "high"')
expect(["submit", "noop", "--input", "nopath"], 2, 'expected NAME=PATH, got "nopath"')
expect(["submit", "noop", "--timeout-ms", "0"], 2, "--timeout-ms needs a positive integer")
# seconds: one parser, the gateway's ranges, refused before connecting
expect(["submit", "noop", "--timeout", "1e9"], 2, "spindle submit: --timeout '1e9': expected seconds in (0, 604800]")
expect(["submit", "noop", "--timeout", "nan"], 2, "--timeout 'nan': expected seconds in (0, 604800]")
expect(["submit", "noop", "--deadline", "0"], 2, "--deadline '0': expected seconds in (0, 31536000]")
expect(["submit", "noop", "--deadline=5s"], 2, "--deadline '5s': expected seconds in (0, 31536000]")
expect(["cancel", "--json", "3"], 2, "unknown option '--json'")  # only status takes --json
expect(["status", "3", "4"], 2, 'expected one job id, got "4"')
expect(["status"], 2, "expected a job id")
expect(["jobs", "--limit=0"], 2, '--limit needs 1-1000, got "0"')
expect(["jobs", "--state", "sleeping"], 2, 'unknown state "sleeping"')
expect(["model", "bench", model, "--iters", "0"], 2, "--iters wants an integer in 1..100000, got '0'")
expect(["model", "bench", model, "--threads=many"], 2, "--threads wants an integer")
expect(["model", "bench", model, "--profile", "0"], 2, "--profile wants an integer in 1..100000, got '0'")
# --profile TOP: after the timing, the TOP slowest nodes and the time per
# operator (ESPCN: three convolutions and a DepthToSpace)
r = run("model", "bench", model, "--batch", "1", "--size", "24", "--iters", "2", "--warmup", "0", "--profile", "2")
lines = r.stdout.splitlines()
head = [i for i, ln in enumerate(lines) if ln.startswith("profile, batch 1: ")]
if r.returncode != 0 or len(head) != 1:
    failures.append(f"model bench --profile: rc {r.returncode}, stdout {r.stdout[:400]!r}, stderr {r.stderr[:300]!r}")
else:
    rows = [ln for ln in lines[head[0] + 2:] if "%  #" in ln]
    by_op = [ln for ln in lines if ln.startswith("by operator: ")]
    if len(rows) != 2 or not all("(Conv" in ln or "(DepthToSpace" in ln for ln in rows) or \
            len(by_op) != 1 or "Conv x" not in by_op[0] or "DepthToSpace x1" not in by_op[0]:
        failures.append(f"model bench --profile 2: rows {rows!r}, by operator {by_op!r}")
expect(["model", "run", model, "--input", "x"], 2, "--input wants NAME=FILE.npy")
expect(["model", "inspect", model, model], 2, "one model file only")
expect(["model", "inspect", model, "-x"], 2, "unknown option '-x'")
expect(["model", "list", "--force"], 2, "unknown option '--force'")
expect(["validate", synthetic, "--set=nodot"], 2, "--set 'nodot': expected stage.key=value")
expect(["validate", synthetic, synthetic], 2, "one file only")
expect(["keygen"], 2, "usage: spindle keygen NAME")
expect(["keygen", "a", "b"], 2, "usage: spindle keygen NAME")

# the GNU forms all parse: --name=value, a unique prefix, options after the file, "--"
expect(["validate", "--plugin-path=/nonexistent", synthetic], 0, out="ok")
expect(["validate", "--plugin-pa", "/nonexistent", synthetic], 0, out="ok")
expect(["validate", synthetic, "--plugin-path", "/nonexistent"], 0, out="ok")
expect(["validate", "--", synthetic], 0, out="ok")
expect(["model", "inspect", "--device=cpu", model], 0, out="inputs:")
expect(["model", "inspect", model, "--fall", "error"], 0, out="inputs:")
# a client command parses fully before it connects: here nothing answers (exit 5, gateway error)
expect(["submit", "noop", "--priority=-5", "--connect=tcp://127.0.0.1:9", "--timeout-ms=300"], 5,
       "no answer from the gateway at tcp://127.0.0.1:9 within 0.3 s")
with tempfile.TemporaryDirectory() as tmp:
    expect(["keygen", "--", os.path.join(tmp, "-k")], 0)
    if not os.path.exists(os.path.join(tmp, "-k.pub")):
        failures.append("keygen -- -k wrote no -k.pub")

# spindle run --repeat N: N jobs on the pipeline loaded once, a summary each
expect(["run", synthetic, "--repeat", "0"], 2, "--repeat '0': expected a whole number from 1 to 1000")
expect(["run", synthetic, "--repeat=two"], 2, "--repeat 'two': expected a whole number from 1 to 1000")
expect(["validate", synthetic, "--repeat", "2"], 2, "unknown option '--repeat'")  # spindle run's alone
r = run("run", synthetic, "--repeat", "3", "--log-format", "json", "--set", "source.frames=20",
        "--set", "sink.expect_frames=20")
runs = []
for line in r.stdout.splitlines():
    try:
        d = json.loads(line)
    except ValueError:
        continue
    if "stages" in d:
        runs.append(d)
if r.returncode != 0 or [d.get("run") for d in runs] != [1, 2, 3] or {d.get("runs") for d in runs} != {3}:
    failures.append(f"run --repeat 3: rc {r.returncode}, runs {[d.get('run') for d in runs]}: {r.stderr[-300:]!r}")
else:
    # each summary is its own job's: 20 frames, 20 messages on every edge
    # (not the pipeline's totals since it was loaded), its own job id
    for d in runs:
        msgs = [e["messages"] for e in d["edges"]]
        if d["frames"] != 20 or d["status"] != "succeeded" or msgs != [20] * len(msgs) or not msgs:
            failures.append(f"run --repeat 3: run {d['run']}: frames {d['frames']}, edge messages {msgs}")
    if len({d["job_id"] for d in runs}) != 3:
        failures.append(f"run --repeat 3: job ids {[d['job_id'] for d in runs]}")
# a run that fails ends the repeat with its exit status: one summary, exit 1
r = run("run", synthetic, "--repeat", "3", "--set", "source.frames=20", "--set", "sink.expect_frames=21")
if r.returncode != 1 or r.stdout.count("synthetic: job") != 1 or "run 1 of 3: synthetic: job 1 failed" not in r.stdout:
    failures.append(f"run --repeat 3 with a failing job: rc {r.returncode}, stdout {r.stdout[:300]!r}")

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else 'FAILED'}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
