#!/usr/bin/env python3
"""Segmented video jobs (docs/jobs.md, "Segments"): one job cut at its
input's keyframes into segments that run as separate jobs on any worker,
joined in order without re-encoding the video, audio continuous.

Real `spindle serve` / `spindle worker` processes on 127.0.0.1, driven with
`spindle submit`, outputs checked with ffprobe. The helpers (processes,
ffprobe, stray files) are test-media-jobs.py's.

usage: test-segments.py SPINDLE SOURCE_ROOT CASE

Cases:
  join     a 60 s clip (160x120, 25 fps, keyframe every 2 s, a 440 Hz tone)
           as one job and as 6 segments on a gateway with 2 in-process
           workers: same frame count, strictly increasing video pts,
           audio as long as the whole job's (within one AAC frame) with no
           gap between packets and no drop in loudness at the joins; the
           status lists 6 segments, each succeeded on its first attempt,
           and progress adds up; no temporary or segment file is left.
  kill     the same clip through a slowed-down transcode on two remote
           `spindle worker` processes; one is killed (SIGKILL) while it runs
           a segment after others finished: only the segments it held run
           again (attempt 2, "worker lost"), every other segment ran once,
           and the output is complete and single.
  redis    kill on the Redis queue: the gateway runs nothing, two stateless
           `spindle worker --queue` processes lease segments and join from
           Redis; the one killed mid-segment loses only that segment, which
           runs again when its lease expires.
  bad      segment requests that cannot work fail at submit with the field
           named: 0, negative, a fraction, both fields, more segments than
           keyframes, an input with no video, a non-media pipeline, an
           output written by a user's plugin whose kind is named like an
           encoder ("encode_raw", which also runs unsegmented with a
           non-media output name: no container check for it); a
           damaged clip accepted with tolerate_errors in 4 segments: the
           segments that met the damage list the decoder's errors as
           warnings, and the job lists them all, each prefixed with its
           segment.
Exit 77 (skip) without ffmpeg/ffprobe. Prints "ok CASE" or "FAIL CASE: why".
"""
import array
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("media_jobs", os.path.join(HERE, "test-media-jobs.py"))
mj = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mj)
Fail, check, cli, status, probe, stray = mj.Fail, mj.check, mj.cli, mj.status, mj.probe, mj.stray

RATE = 48000


def make_clip(path, seconds=60, size="160x120"):
    """H.264 (keyframe every 2 s, closed GOPs) + AAC tone."""
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size={size}:rate=25:duration={seconds}",
                    "-f", "lavfi", "-i", f"sine=frequency=440:sample_rate={RATE}:duration={seconds}",
                    "-c:v", "libx264", "-preset", "veryfast", "-g", "50", "-keyint_min", "50", "-sc_threshold", "0",
                    "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "96k", "-shortest", path], check=True)


def rawlist_config(tmp):
    """decode -> encode_raw (tests/jobs/rawwriter.c, a user's plugin whose
    kind name starts like the media encoders'): one text line per frame."""
    plugdir = os.path.join(os.environ["SPINDLE_BUILD_ROOT"], "tests", "jobs")
    check(os.path.exists(os.path.join(plugdir, "libspindle-rawwriter.so")), f"no libspindle-rawwriter.so in {plugdir}")
    with open(os.path.join(tmp, "rawlist.toml"), "w") as f:
        f.write(f'[pipeline]\nname = "rawlist"\n[plugins]\npath = ["{plugdir}"]\n'
                '[pipeline.inputs]\nvideo = "decode.path"\n[pipeline.outputs]\nlist = "list.path"\n'
                '[[stage]]\nname = "decode"\nkind = "decode"\npath = "in.mp4"\npixel_format = "yuv420p"\n'
                '[[stage]]\nname = "list"\nkind = "encode_raw"\ninputs = ["decode.video"]\n')
    return '[[pipeline]]\nname = "rawlist"\nconfig = "rawlist.toml"\n'


def server_config(tmp, slow_us=0, extra=""):
    """transcode.toml (veryfast x264), optionally with a `cost` stage that
    sleeps slow_us per frame between decode and encode (sleeps, not spins:
    the slow stage stands for a slow model without taking the CPU that the
    other tests of a parallel suite need)."""
    text = open(os.path.join(mj.SRC, "configs", "transcode.toml")).read()
    text = text.replace('"../', '"' + os.path.join(mj.SRC, "")).replace('preset = "medium"', 'preset = "veryfast"')
    if slow_us:
        text = text.replace('inputs = { video = "decode.video", audio = "decode.audio" }',
                            'inputs = { video = "work", audio = "decode.audio" }')
        text += f'\n[[stage]]\nname = "work"\nkind = "cost"\ninputs = ["decode.video"]\nus = {slow_us}\nsleep = true\n'
    with open(os.path.join(tmp, "transcode.toml"), "w") as f:
        f.write(text)
    cfg = os.path.join(tmp, "server.toml")
    with open(cfg, "w") as f:
        f.write('[server]\ndevices = "cpu"\n[queue]\nmax_attempts = 3\n'
                '[[pipeline]]\nname = "transcode"\nconfig = "transcode.toml"\n' + extra)
    return cfg


def ffprobe_json(*args):
    r = subprocess.run(["ffprobe", "-v", "error", "-of", "json", *args], capture_output=True, text=True)
    check(r.returncode == 0, f"ffprobe {args}: {r.stderr}")
    return json.loads(r.stdout)


def video_pts(path):
    fr = ffprobe_json("-select_streams", "v", "-show_entries", "frame=pts", path)["frames"]
    return [int(f["pts"]) for f in fr]


def audio_packets(path):
    """[(pts, duration)] of the audio stream, in its time base units."""
    pk = ffprobe_json("-select_streams", "a", "-show_entries", "packet=pts,duration", path)["packets"]
    return [(int(p["pts"]), int(p["duration"])) for p in pk]


def decoded_audio(path):
    """The audio decoded to mono float32 at RATE, as the player hears it."""
    r = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-vn", "-ac", "1", "-ar", str(RATE), "-f", "f32le", "-"],
                       capture_output=True)
    check(r.returncode == 0, f"decoding the audio of {path}: {r.stderr[-500:]!r}")
    a = array.array("f")
    a.frombytes(r.stdout)
    return a


def rms(a, lo, hi):
    n = max(hi - lo, 1)
    return (sum(x * x for x in a[lo:hi]) / n) ** 0.5


def check_join(ref, seg, joins):
    """seg is ref's content cut and joined at the times `joins` (seconds)."""
    pr, ps = probe(ref), probe(seg)
    check(int(ps["v"]["nb_read_frames"]) == int(pr["v"]["nb_read_frames"]),
          f"frames: segmented {ps['v']['nb_read_frames']}, whole {pr['v']['nb_read_frames']}")
    pts = video_pts(seg)
    bad = [i for i in range(1, len(pts)) if pts[i] <= pts[i - 1]]
    check(not bad, f"video pts not strictly increasing at frames {bad[:5]}: {[pts[i - 1:i + 1] for i in bad[:3]]}")
    check(ps["a"] is not None, f"{seg}: no audio stream")
    # audio: one frame of AAC is 1024 samples
    da, ra = float(ps["a"]["duration"]), float(pr["a"]["duration"])
    check(abs(da - ra) <= 1024 / RATE, f"audio lasts {da} s segmented, {ra} s whole")
    check(abs(da - float(ps["v"]["duration"])) <= 1024 / RATE,
          f"audio {da} s vs video {ps['v']['duration']} s")
    pk = audio_packets(seg)
    gaps = [(i, pk[i - 1], pk[i]) for i in range(1, len(pk)) if pk[i][0] != pk[i - 1][0] + pk[i - 1][1]]
    check(not gaps, f"audio packets not back to back: {gaps[:5]}")
    a, b = decoded_audio(seg), decoded_audio(ref)
    check(abs(len(a) - len(b)) <= 1024, f"decoded audio: {len(a)} samples segmented, {len(b)} whole")
    # No gap and no click at a join: the tone's loudness around each join
    # (5 ms windows) is the same as the whole job's there.
    for t in joins:
        c = int(t * RATE)
        for lo in range(c - 960, c + 960, 240):
            x, y = rms(a, lo, lo + 240), rms(b, lo, lo + 240)
            check(abs(x - y) <= 0.25 * y + 1e-3,
                  f"audio at {lo / RATE:.3f} s (join at {t:.3f} s): RMS {x:.4f} segmented, {y:.4f} whole")


def submit(ep, clip, out, *extra, check_rc=0, wait=True):
    r = cli("submit", "transcode", "--input", f"video={clip}", "--output", f"video={out}", *extra,
            *(["--wait"] if wait else []), "--connect", ep, timeout=600, check_rc=check_rc)
    return r


def case_join(tmp):
    clip = f"{tmp}/in.mp4"
    make_clip(clip)
    p, ep = mj.start_serve(tmp, server_config(tmp), "--workers", "2")
    os.mkdir(f"{tmp}/out")
    submit(ep, clip, f"{tmp}/out/whole.mp4")
    r = submit(ep, clip, f"{tmp}/out/seg.mp4", "--segments", "6")
    jid = int(r.stdout.split()[0])
    st = json.loads(cli("status", str(jid), "--json", "--connect", ep, check_rc=0).stdout)
    segs = st.get("segments")
    check(st["state"] == "succeeded" and segs and len(segs) == 6, f"status: {st}")
    check([s["index"] for s in segs] == list(range(6)), f"segment order: {segs}")
    check(all(s["state"] == "succeeded" and s["attempts"] == 1 for s in segs), f"segments: {segs}")
    check("warnings" not in st and not any("warnings" in s for s in segs), f"a clean clip warned: {st}")
    check(st["total"] == sum(s["total"] for s in segs) == 1500 and st["done"] == st["total"],
          f"progress {st['done']}/{st['total']} vs the segments' {[s['total'] for s in segs]}")
    check(segs[0]["start"] == 0 and all(abs(segs[i]["end"] - segs[i + 1]["start"]) < 1e-9 for i in range(5)),
          f"segments do not tile the clip: {[(s['start'], s['end']) for s in segs]}")
    check(all(abs(s["start"] / 2 - round(s["start"] / 2)) < 1e-6 for s in segs),
          f"a segment starts off a keyframe (every 2 s): {[s['start'] for s in segs]}")
    check_join(f"{tmp}/out/whole.mp4", f"{tmp}/out/seg.mp4", [s["start"] for s in segs[1:]])
    # segment_seconds: about 20 s each
    r = submit(ep, clip, f"{tmp}/out/secs.mkv", "--segment-seconds", "20")
    st = status(ep, int(r.stdout.split()[0]))
    check(len(st["segments"]) == 3, f"segment_seconds=20 of 60 s: {len(st['segments'])} segments")
    check(int(probe(f"{tmp}/out/secs.mkv")["v"]["nb_read_frames"]) == 1500, "mkv join frame count")
    check(sorted(os.listdir(f"{tmp}/out")) == ["secs.mkv", "seg.mp4", "whole.mp4"],
          f"files left beside the outputs: {os.listdir(tmp + '/out')}")
    check(p.poll() is None, "gateway died")


def wait_for(fn, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise Fail(f"timed out waiting for {what}")


def on_worker(seg, name):
    """Whether a segment's lease is held by worker `name` (remote: "...:NAME",
    Redis: "worker:NAME:SLOT")."""
    w = seg.get("worker", "")
    return w.endswith(":" + name) or f":{name}:" in w


def case_kill(tmp, redis=False):
    clip = f"{tmp}/in.mp4"
    make_clip(clip)
    # 250 frames a segment, about 3 s each: the kill waits to see wa inside
    # a segment, and each look is a `spindle status` process (slower under
    # ASan on a loaded machine; a stateless Redis worker also writes its
    # progress only once a second). With 1 s segments the window was about
    # half a second, and a CI run missed all of wa's segments.
    cfg = server_config(tmp, slow_us=12000)
    if redis:
        # stateless workers leasing straight from Redis; the gateway runs nothing
        if not shutil.which("redis-server"):
            raise mj.Skip("redis-server is not installed (Debian package redis-server)")
        url = mj.start_redis(tmp)
        # a lease of 4 s, renewed every 1.3 s: a killed worker's segment stays
        # leased to it for at least 2.6 s, time to read which one it was
        p, ep = mj.start_serve(tmp, cfg, "--workers", "0", "--queue", url, "--lease-ms", "4000",
                               "--backoff-ms", "50")
        wargs = ["--queue", url, "--lease-ms", "4000"]
    else:
        # lost after 3 missed heartbeats: 2 to 3 s after the kill
        p, ep = mj.start_serve(tmp, cfg, "--workers", "0", "--heartbeat-ms", "1000", "--lease-ms", "4000",
                               "--backoff-ms", "50")
        wargs = ["--connect", ep, "--heartbeat-ms", "1000"]
    ws = {n: subprocess.Popen([mj.SPINDLE, "worker", *wargs, "--config", cfg, "--name", n, "--slots", "1"],
                              stdout=open(f"{tmp}/worker-{n}.log", "ab"), stderr=subprocess.STDOUT, cwd=tmp)
          for n in ("wa", "wb")}
    mj.PROCS.extend(ws.values())
    os.mkdir(f"{tmp}/out")
    r = submit(ep, clip, f"{tmp}/out/seg.mp4", "--segments", "6", wait=False)
    jid = int(r.stdout.split()[0])

    seen = []

    def victim():
        t = time.monotonic()
        st = status(ep, jid)
        segs = st.get("segments", [])
        seen.append((round(time.monotonic() - t, 2), st.get("state"),
                     [(s["index"], s["state"], next((n for n in ws if on_worker(s, n)), ""), s.get("done"))
                      for s in segs]))
        if st.get("state") in ("succeeded", "failed", "cancelled", "dead"):
            raise Fail(f"the job ended before wa was seen inside a segment; looks (seconds each, segments): {seen}")
        done = [s for s in segs if s["state"] == "succeeded"]
        # well inside a segment (not about to finish): the kill lands on it
        running = [s for s in segs if s["state"] == "running" and on_worker(s, "wa")
                   and 10 < s["done"] < s["total"] - 100]
        return (st, segs) if done and running else None
    wait_for(victim, 90, "worker wa to run a segment after one finished")
    t0 = time.monotonic()
    ws["wa"].send_signal(signal.SIGKILL)
    ws["wa"].wait()
    # Which segment wa held is read after the kill, not before: the status
    # seen before it can be a second or two old (a stateless worker writes
    # its progress once a second), and wa may have finished that segment and
    # leased the next by the time the signal lands. After the kill nothing
    # changes until wa's lease expires or the gateway misses its heartbeats,
    # 2 s at the least.
    after = status(ep, jid)["segments"]
    late = time.monotonic() - t0
    killed = {s["index"] for s in after if s["state"] == "running" and on_worker(s, "wa")}
    finished = {s["index"] for s in after if s["state"] == "succeeded"}
    check(killed or late < 1.8, f"the status after the kill came {late:.1f} s late and shows no segment on wa: "
          f"which one it held cannot be told (its lease may have expired): {after}")
    cli("watch", str(jid), "--connect", ep, timeout=120, check_rc=0)
    st = status(ep, jid)
    segs = st["segments"]
    check(st["state"] == "succeeded" and len(segs) == 6, f"status: {st}")
    for s in segs:
        want = 2 if s["index"] in killed else 1
        check(s["state"] == "succeeded" and s["attempts"] == want,
              f"segment {s['index']}: {s['attempts']} attempts, want {want} "
              f"(killed on wa: {sorted(killed)}, finished before: {sorted(finished)}): {segs}")
        if s["index"] in killed:
            check("lost" in s["errors"][0]["error"], f"segment {s['index']}: first attempt's error {s['errors']}")
    check(int(probe(f"{tmp}/out/seg.mp4")["v"]["nb_read_frames"]) == 1500, "frames after the kill")
    pts = video_pts(f"{tmp}/out/seg.mp4")
    check(all(pts[i] > pts[i - 1] for i in range(1, len(pts))), "pts not increasing after the kill")
    check(os.listdir(f"{tmp}/out") == ["seg.mp4"], f"exactly one output expected: {os.listdir(tmp + '/out')}")
    check(ws["wb"].poll() is None and p.poll() is None, "the gateway or the surviving worker exited")


def case_bad(tmp):
    clip = f"{tmp}/in.mp4"
    make_clip(clip, seconds=8)  # 4 keyframes
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", clip, "-vn", "-c:a", "copy", f"{tmp}/audio.m4a"], check=True)
    p, ep = mj.start_serve(tmp, server_config(tmp, extra=rawlist_config(tmp)), "--workers", "1")
    os.mkdir(f"{tmp}/out")
    # A user's writer whose kind is named like an encoder ("encode_raw"):
    # its output is not media, so its name gets no container check at
    # submit, and a segmented job through it is refused at submit (the
    # parts could not be joined), naming the output and the kind. (Before,
    # the service took any kind starting "encode" for the media encoder.)
    r = cli("submit", "rawlist", "--input", f"video={clip}", "--output", f"list={tmp}/out/frames.txt", "--wait",
            "--connect", ep, check_rc=None)
    check(r.returncode == 0, f"rawlist to frames.txt: exit {r.returncode}, {r.stderr!r}")
    lines = open(f"{tmp}/out/frames.txt").read().splitlines()
    check(len(lines) == 200 and lines[0] == "seq 0, 28800 bytes", f"frames.txt: {len(lines)} lines, {lines[:1]}")
    os.unlink(f"{tmp}/out/frames.txt")
    r = cli("submit", "rawlist", "--input", f"video={clip}", "--output", f"list={tmp}/out/x.txt", "--segments", "2",
            "--connect", ep, check_rc=None)
    want = ('"segments": output "list" is written by a stage of kind "encode_raw", not by a media encoder\'s path: '
            'its parts could not be joined')
    check(r.returncode == 5 and want in r.stderr.decode(), f"rawlist in segments: exit {r.returncode}, {r.stderr!r}")
    cases = [
        (["--segments", "0"], clip, '"segments" must be an integer'),
        (["--segments", "-3"], clip, '"segments" must be an integer'),
        (["--segments", "2.5"], clip, '"segments" must be an integer'),
        (["--segment-seconds", "0"], clip, '"segment_seconds" must be'),
        (["--segment-seconds", "-1"], clip, '"segment_seconds" must be'),
        (["--segments", "5"], clip, "has 4 keyframes, so at most 4 segments"),
        (["--segments", "2"], f"{tmp}/audio.m4a", "no video stream"),
        (["--segments", "2", "--param", "start=1.0"], clip, 'cannot be combined with param "start"'),
        (["--segments", "2", "--deadline", "60"], clip, 'cannot be combined with "deadline"'),
    ]
    for extra, src, want in cases:
        r = submit(ep, src, f"{tmp}/out/x.mp4", *extra, wait=False, check_rc=None)
        msg = r.stderr.decode()
        check(r.returncode == 5 and want in msg, f"{extra} on {os.path.basename(src)}: exit {r.returncode}, "
              f"stderr {msg!r} lacks {want!r}")
        if "no video" in want:
            check('input "video"' in msg and "audio.m4a" in msg, f"error does not name the input: {msg!r}")
    r = cli("submit", "transcode", "--input", f"video={clip}", "--output", f"video={tmp}/out/x.mp4",
            "--segments", "two", "--connect", ep)
    check(r.returncode != 0 and b"--segments" in r.stderr, f"--segments two: {r.returncode} {r.stderr!r}")
    # the gateway is fine and the same clip in 4 segments (one per keyframe) joins
    submit(ep, clip, f"{tmp}/out/ok.mp4", "--segments", "4")
    check(int(probe(f"{tmp}/out/ok.mp4")["v"]["nb_read_frames"]) == 200, "4 segments of an 8 s clip")
    check(os.listdir(f"{tmp}/out") == ["ok.mp4"], f"files left: {os.listdir(tmp + '/out')}")
    # Two segmented SUBMITs of one output in flight at once (the second
    # arrives while the first is planned on the gateway's thread pool): one
    # is stored, the other refused naming it. (Before, the files were checked
    # before planning, so both passed.)
    import zmq
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(ep)
    for i in (1, 2):
        body = {"req": i, "pipeline": "transcode", "inputs": {"video": clip},
                "outputs": {"video": f"{tmp}/out/twice.mp4"}, "segments": 4}
        d.send_multipart([b"", b"SPN1", b"SUBMIT", json.dumps(body).encode()])
    replies = []
    for _ in (1, 2):
        check(d.poll(20000), "no reply to a segmented SUBMIT")
        fr = d.recv_multipart()
        replies.append((fr[2].decode(), json.loads(fr[3])))
    d.close(0)
    kinds = sorted(r[0] for r in replies)
    check(kinds == ["ERROR", "SUBMITTED"], f"two segmented jobs on one output: {replies}")
    ok = next(r[1] for r in replies if r[0] == "SUBMITTED")
    err = next(r[1] for r in replies if r[0] == "ERROR")
    check(f"is the output of job {ok['id']}" in err.get("message", ""), f"the refusal: {err}")
    check(cli("watch", str(ok["id"]), "--connect", ep, timeout=120).returncode == 0, "the stored one")
    os.unlink(f"{tmp}/out/twice.mp4")
    # A damaged clip accepted with tolerate_errors, in segments: the segments
    # that met the damage list what the decoder said of it, and the whole job lists them all, each
    # prefixed with its segment (docs/jobs.md, "Warnings").
    # The same bytes every run: meson sets MALLOC_PERTURB_ to a random value
    # per test, and FFmpeg's output varies with it (under 173 the damage below
    # lands where the decoder reports nothing), so the clip is made without it.
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=160x120:rate=25:duration=8",
                    "-c:v", "libx264", "-g", "50", "-keyint_min", "50", "-sc_threshold", "0", "-pix_fmt", "yuv420p",
                    f"{tmp}/v.mp4"], check=True, env=env)
    data = bytearray(open(f"{tmp}/v.mp4", "rb").read())
    mid = len(data) // 2  # inside mdat: the index (moov) is at the end
    data[mid:mid + 400] = b"\xab" * 400
    open(f"{tmp}/vbad.mp4", "wb").write(data)
    r = submit(ep, f"{tmp}/vbad.mp4", f"{tmp}/out/tol.mp4", "--segments", "4", "--param", "tolerate_errors=true")
    jid = int(r.stdout.split()[0])
    st = status(ep, jid)
    wn, segs = st.get("warnings", []), st["segments"]
    # FFmpeg's decode errors at least ("error while decoding MB ..."); whether
    # it also flags the frame corrupt (our "damaged input accepted" line)
    # varies with its frame threads
    hit = [s for s in segs if any(w.startswith("decode: ") and "vbad.mp4" in w for w in s.get("warnings", []))]
    check(st["state"] == "succeeded" and hit, f"damaged clip in segments: {st['state']}, segments' warnings "
          f"{[s.get('warnings') for s in segs]}")
    want = [f"segment {s['index']}: {w}" for s in segs for w in s.get("warnings", [])]
    check(wn == want and all(w.split(": ")[1] == "decode" for w in wn),
          f"the job's warnings are not its segments', prefixed: {wn} vs {want}")
    printed = [ln.split(" warning: ", 1)[1] for ln in r.stderr.decode().splitlines() if " warning: " in ln]
    check(printed == wn, f"submit --wait printed {printed}")
    check(p.poll() is None, "gateway died")


def case_redis(tmp):
    """kill, on the Redis queue: two `spindle worker --queue` processes lease
    the segments (and the join) straight from Redis; one is killed mid-segment
    and only its segment runs again once its lease expires."""
    case_kill(tmp, redis=True)


CASES = {"join": case_join, "kill": case_kill, "bad": case_bad, "redis": case_redis}


def main():
    mj.SPINDLE, mj.SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not shutil.which("ffprobe") or not shutil.which("ffmpeg"):
        print("skip: no ffprobe/ffmpeg")
        return 77
    name = sys.argv[3]
    tmp = tempfile.mkdtemp(prefix=f"spn-segments-{name}-")
    rc = 0
    try:
        CASES[name](tmp)
        print(f"ok {name}")
    except mj.Skip as e:
        print(f"skip {name}: {e}")
        rc = 77
    except Fail as e:
        print(f"FAIL {name}: {e}")
        rc = 1
    except Exception:
        traceback.print_exc()
        print(f"FAIL {name}: exception")
        rc = 1
    finally:
        for pr in mj.PROCS:
            if pr.poll() is None:
                pr.send_signal(signal.SIGTERM)
                try:
                    pr.wait(10)
                except subprocess.TimeoutExpired:
                    pr.kill()
                    pr.wait()
        if rc == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"(kept {tmp})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
