#!/usr/bin/env python3
"""Pipeline benchmark (issue 14): Spindle's enhance and lipsync pipelines
beside the same pipelines written the way a Python team writes them, on the
same clips, the same device and the same model files, in one run.

  pipeline-gpu-bench.py --build BUILD_DIR --clips CLIPS_DIR [--out results.json]
                        [--devices cuda|cpu] [--frames N] [--pipelines enhance,lipsync]
                        [--w2l wav2lip.onnx] [--encoder auto|ffmpeg|spindle|cv2] [--no-peer]
                        [--peer-engine auto|torch|ort] [--peer-threads N]

CLIPS_DIR is what tools/make-bench-clips.sh writes: talking-head-<H>p.mp4
files and speech.wav. Every clip runs through every pipeline.

Spindle, for each pipeline and clip:
  full      `spindle run configs/<pipeline>.toml --devices D --log-format json
            --repeat 2 --set decode.path=CLIP --set encode.path=OUT ...`;
            frames/s is the second job's frames / elapsed_s (from the job's
            start to the output file closed and renamed; the models were
            loaded, and warmed by the first job, before); the first job's is
            reported as "cold" (--repeat N: N jobs, the last reported).
  GPU part  the same file with the encoder replaced by a sink that counts
            frames and writes nothing (filesink, empty path): decode (on the
            CPU, as in the full run) -> models -> paste, and the last stage's
            frames handed to the host. It shows what the pipeline does without
            the x264 encoder, which runs on the CPU.
  From the summary: each stage's busy time and share (the bounding stage is
  the one with the largest share), and the bytes that crossed between host
  and device per output frame: the job's `transfers` when the build reports
  them (edges and the stages' own copies), otherwise the edges' h2d + d2h
  bytes only (marked "edges only": a stage that uploads its input itself is
  then not counted). The models each stage loaded are read from the log.

Python peer (Wav2Lip inference.py style), same device and model files:
  cv2.VideoCapture reads every frame first; the face detector is the ONNX file
  Spindle loaded, converted to torch modules by onnx2torch (or OpenCV's Haar
  cascade if Spindle fell back to its Haar cascade), run on batches of 16
  frames, decoded (priors, NMS) in NumPy; crops, resizes and pastes with
  OpenCV and NumPy on the host (a face box goes through the SR model as one
  image, as Spindle's stage does when the box is within its `tile`); the
  super-resolution and Wav2Lip models are
  the same ONNX files through onnx2torch, at each stage's precision from the
  config (fp16 = torch.autocast float16, tf32 = TF32 matmul and convolution,
  fp32); Wav2Lip in batches of the config's batch_size (128) with the mel
  spectrogram computed in NumPy as Wav2Lip's audio.py does; frames are encoded
  by an encoder subprocess fed raw frames on its stdin, with the config's
  codec, preset and crf:
    ffmpeg   the ffmpeg CLI (BGR frames on stdin, libx264, AAC audio), when
             `ffmpeg` is on PATH;
    spindle  where there is no ffmpeg CLI (a GPU host): a Spindle transcode
             process with the same libx264, fed YUV4MPEG on its stdin (the
             frames are converted to I420 by cv2 in the peer, as ffmpeg's
             own swscale would do);
    cv2      cv2.VideoWriter (MPEG-4 part 2, no audio): not the same encoder,
             reported as such.
  With --devices cpu the peer's models run in ONNX Runtime's CPU provider
  (--peer-engine ort, the default there: the faster CPU engine a Python team
  would pick, with its default threads unless --peer-threads), on NumPy
  arrays, the same ONNX files; PyTorch on the CPU with --peer-engine torch.
  Timed as Spindle is: the models are loaded and run once before the clock
  starts (one warm-up per model); the clock runs from opening the clip to the
  encoder's exit. The peer counts the bytes it copies between host and device.

Output: a Markdown table (pipeline, resolution, frames, Spindle frames/s,
Python frames/s, ratio, PCIe bytes per frame and in frames of W*H*3, GPU-part
frames/s, bounding stage), each run's stage times and models, and a JSON
file with everything. Not a test: no figure gates anything.

Needs: a Spindle build (with CUDA for --devices cuda), python3 with numpy,
onnx, opencv-python(-headless), and torch with onnx2torch (the torch peer)
or onnxruntime (the CPU peer). Exits 77 without what the chosen peer needs.
"""
import argparse
import contextlib
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

try:
    import numpy as np
    import cv2
    import onnx
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)
# The peer's engine: PyTorch (with onnx2torch) or ONNX Runtime; either may be
# missing, main() says what the chosen one needs.
try:
    import torch
    from onnx2torch import convert
except ImportError as e:
    torch, TORCH_MISSING = None, str(e)
try:
    import onnxruntime as ort
except ImportError as e:
    ort, ORT_MISSING = None, str(e)

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FD_BATCH = 16  # inference.py's face_det_batch_size
HAAR = "haarcascade_frontalface_default.xml"


def load_script(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------
# Pipeline files: read with tomllib, rewritten for the GPU-part run
# --------------------------------------------------------------------------

def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def toml_dump(doc):
    out = []
    p = doc.get("pipeline", {})
    out.append("[pipeline]")
    out += [f"{k} = {toml_value(v)}" for k, v in p.items() if not isinstance(v, dict)]
    for k, v in p.items():
        if isinstance(v, dict):
            out.append(f"\n[pipeline.{k}]")
            out += [f"{kk} = {toml_value(vv)}" for kk, vv in v.items()]
    for s in doc.get("stage", []):
        out.append("\n[[stage]]")
        out += [f"{k} = {toml_value(v)}" for k, v in s.items()]
    return "\n".join(out) + "\n"


def read_config(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def stage_of(doc, name):
    for s in doc["stage"]:
        if s["name"] == name:
            return s
    return None


def counting_sink_config(cfg_path, out_path):
    """The pipeline with its encoder replaced by a frame-counting filesink.
    Relative paths are made absolute (the file moves), the encoder's audio
    input is dropped from [pipeline.inputs]."""
    doc = read_config(cfg_path)
    base = os.path.dirname(os.path.abspath(cfg_path))
    for s in doc["stage"]:
        for k, v in list(s.items()):
            if isinstance(v, str) and k in ("path", "model", "audio_path", "cascade", "video") and v and \
                    not os.path.isabs(v) and os.path.exists(os.path.join(base, v)):
                s[k] = os.path.normpath(os.path.join(base, v))
    enc = stage_of(doc, "encode")
    enc_inputs = enc["inputs"]
    idx = doc["stage"].index(enc)
    doc["stage"][idx] = {"name": "encode", "kind": "filesink", "inputs": enc_inputs, "path": ""}
    ins = doc["pipeline"].get("inputs", {})
    # the keys an input sets: "stage.key", a list of them, or an optional input's table of either
    def targets(v):
        v = v.get("key", "") if isinstance(v, dict) else v
        return v if isinstance(v, list) else [v]
    for k in [k for k, v in ins.items() if any(t.startswith("encode.") and t != "encode.path" for t in targets(v))]:
        del ins[k]
    with open(out_path, "w") as f:
        f.write(toml_dump(doc))
    return out_path


def precision_of(stage):
    p = (stage or {}).get("precision", "auto")
    return "tf32" if p == "auto" else p


# --------------------------------------------------------------------------
# Spindle
# --------------------------------------------------------------------------

def run_spindle(spindle, cfg, sets, devices, env, log_path, pcie=None, repeat=1, log_level="info"):
    """One `spindle run` (with --repeat N: N jobs on the pipeline loaded
    once); the last job's JSON summary with wall_s, models, the first job's
    figures as "cold" when there were several, and, when `pcie` (an
    NvmlPcie) is given, NVML's estimate of the last job's PCIe bytes."""
    args = [spindle, "run", cfg, "--devices", devices, "--log-format", "json", "--log-level", log_level]
    if repeat > 1:
        args += ["--repeat", str(repeat)]
    for s in sets:
        args += ["--set", s]
    if pcie:
        pcie.start()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        lines = []
        for line in p.stdout:  # the summary's arrival time ends the job's window
            lines.append((time.perf_counter(), line))
        rc = p.wait()
        err.seek(0)
        stderr = err.read()
    wall = time.perf_counter() - t0
    samples = pcie.stop() if pcie else None
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(args) + "\n" + stderr + "".join(l for _, l in lines))
    runs = []
    for t, line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "stages" in d:
            runs.append((d, t))
    summary, t_end = runs[-1] if runs else (None, None)
    if summary and len(runs) < repeat and summary.get("status") == "succeeded":
        summary = dict(summary, status="incomplete", error=f"{len(runs)} of {repeat} runs")
    if rc or not summary or summary.get("status") != "succeeded":
        why = (summary or {}).get("error") or (stderr.strip().splitlines() or [f"exit {rc}"])[-1]
        raise RuntimeError(f"spindle run {os.path.basename(cfg)} failed: {why} (log: {log_path})")
    summary["wall_s"] = wall
    summary["models"] = models_from_log(stderr)
    summary["lips_batches"] = lips_batches_from_log(stderr, len(runs))
    if len(runs) > 1:
        c = runs[0][0]
        summary["cold"] = {"frames": c["frames"], "elapsed_s": c["elapsed_s"],
                           "frames_per_s": c["frames"] / c["elapsed_s"], "stages": c["stages"]}
    if samples is not None:
        summary["nvml_pcie"] = NvmlPcie.integrate(samples, t_end - summary["elapsed_s"], t_end)
    return summary


class NvmlPcie:
    """NVML's PCIe throughput counters (nvmlDeviceGetPcieThroughput: KB/s over
    a 20 ms window, sampled back to back by a thread), integrated over a
    job's time: an estimate of every byte that crossed, whoever copied it, to
    check the summary's counted copies against. None where NVML is missing."""

    def __init__(self, index=0):
        import ctypes
        self.ct = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2():
            raise OSError("nvmlInit failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.dev)):
            raise OSError(f"no NVML device {index}")

    @staticmethod
    def create():
        try:
            return NvmlPcie()
        except (OSError, AttributeError):
            return None

    def start(self):
        import threading
        self.samples, self.stopping = [], False

        def loop():
            v = self.ct.c_uint()
            while not self.stopping:
                row = [time.perf_counter()]
                for counter in (1, 0):  # RX (host to device), TX (device to host), from the GPU's side
                    row.append(v.value if self.lib.nvmlDeviceGetPcieThroughput(self.dev, counter,
                                                                              self.ct.byref(v)) == 0 else 0)
                self.samples.append(row)
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def stop(self):
        self.stopping = True
        self.thread.join()
        return self.samples

    @staticmethod
    def integrate(samples, t0, t1):
        h2d = d2h = 0.0
        for (ta, rx, tx), (tb, _, _) in zip(samples, samples[1:]):
            dt = max(0.0, min(tb, t1) - max(ta, t0))
            h2d += rx * 1024.0 * dt
            d2h += tx * 1024.0 * dt
        return {"h2d": h2d, "d2h": d2h, "samples": len(samples)}


def lips_batches_from_log(text, jobs):
    """The faces of each Wav2Lip run of the last job, from lipsync's debug
    lines ("wav2lip run: N faces from J jobs"); with --repeat the jobs run
    one after another, each ended by its "succeeded" or "failed" event.
    [] at info level or without a lips stage."""
    sizes, per_job = [], []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        m = re.match(r"wav2lip run: (\d+) faces", d.get("msg", ""))
        if m:
            sizes.append(int(m.group(1)))
        elif d.get("event") in ("succeeded", "failed") and sizes:
            per_job.append(sizes)
            sizes = []
    if sizes:
        per_job.append(sizes)
    return per_job[-1] if per_job else []


def models_from_log(text):
    """{stage: model file or 'builtin: ...'} from the vision stages' log lines
    ("facedetect faces: model PATH" or "...: HINT; using BUILTIN")."""
    out = {}
    for line in text.splitlines():
        try:
            msg = json.loads(line).get("msg", "")
        except ValueError:
            msg = line
        m = re.match(r"(facedetect|superres) (\S+): .*; using (.+)$", msg)
        if m:
            out[m.group(2)] = "builtin: " + m.group(3)
            continue
        m = re.match(r"(facedetect|superres) (\S+): model (.+)$", msg)
        if m:
            out[m.group(2)] = os.path.normpath(m.group(3))
    return out


DIRS = ("h2d", "d2h", "d2d")


def transfers(summary):
    """Bytes between host and device per output frame: (dict, source)."""
    frames = max(1, summary["frames"])
    tot = {d: 0 for d in DIRS}
    if "transfers" in summary and all(isinstance(summary["transfers"].get(d), dict) for d in DIRS):
        for d in DIRS:
            tot[d] = summary["transfers"][d]["bytes"]
        source = "job transfers (edges + stages)"
    else:
        stage_fields = any(isinstance(s.get("h2d"), dict) for s in summary["stages"])
        for e in summary.get("edges", []) + (summary["stages"] if stage_fields else []):
            for d in DIRS:
                if isinstance(e.get(d), dict):
                    tot[d] += e[d]["bytes"]
        source = "edges + stages" if stage_fields else "edges only"
    per = {d: tot[d] / frames for d in DIRS}
    per["pcie"] = per["h2d"] + per["d2h"]  # d2d on one GPU stays on the GPU
    return per, source


def stage_bounds(summary):
    """Busy ms a frame of the slowest stage and of all stages together, and
    the frames/s each allows: with a thread per stage (the default) the
    stages overlap and the slowest one bounds the pipeline; with
    SPINDLE_DEVICE_THREADS=device the GPU's stages share one thread and
    their sum does."""
    n = summary.get("frames") or 0
    busy = [st["busy_ms"] for st in summary.get("stages", [])]
    if not n or not busy or max(busy) <= 0:
        return None
    mx, sm = max(busy) / n, sum(busy) / n
    return {"max_ms": mx, "sum_ms": sm, "max_fps": 1000.0 / mx, "sum_fps": 1000.0 / sm}


def bounding_stage(summary):
    s = max(summary["stages"], key=lambda s: s["busy_ms"])
    return s["name"], s["share"]


# --------------------------------------------------------------------------
# The Python peer
# --------------------------------------------------------------------------

class Peer:
    """Wav2Lip inference.py-style pipeline: whole clip in memory, models in
    torch, pixels in OpenCV/NumPy on the host."""

    def __init__(self, device, w2l_batch=128):
        self.dev = torch.device(device)
        self.cuda = self.dev.type == "cuda"
        self.common_init(w2l_batch)

    def common_init(self, w2l_batch):
        """What every peer keeps, whatever runs its models."""
        self.h2d = 0
        self.d2h = 0
        self.phase = {}
        self.w2l_batch = w2l_batch
        self.mel_mod = load_script(os.path.join(SRC, "tests", "media", "test-mel.py"), "spn_bench_mel")

    # host <-> device, counted
    def up(self, a):
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.cuda:
            self.h2d += t.numel() * t.element_size()
        return t.to(self.dev)

    def down(self, t):
        if self.cuda:
            self.d2h += t.numel() * t.element_size()
        return t.cpu().numpy()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def host(self, t):
        """A model output as a float32 NumPy array on the host."""
        return self.down(t.float())

    def fd_input(self, frames):
        """(B,H,W,3) u8 BGR frames -> RetinaFace's input: BGR minus the means, NCHW float."""
        x = self.up(np.stack(frames))
        return x.permute(0, 3, 1, 2).float() - self.fd_mean

    def sr_frame(self, net, prec, bgr):
        """A BGR u8 image through a float RGB 0..1 SR model; returns BGR u8."""
        x = self.up(bgr[:, :, ::-1].copy()).permute(2, 0, 1)[None].float().div_(255)
        y = self.run_model(net, prec, x)
        y = (y[0].float().clamp_(0, 1).mul_(255).round_()).to(torch.uint8).permute(1, 2, 0)
        return self.down(y)[:, :, ::-1]

    def no_grad(self):
        return torch.inference_mode()

    def timed(self, name, fn, *a):
        self.sync()
        t0 = time.perf_counter()
        r = fn(*a)
        self.sync()
        self.phase[name] = self.phase.get(name, 0.0) + time.perf_counter() - t0
        return r

    def fd_means(self):
        return torch.tensor([104.0, 117.0, 123.0], device=self.dev).view(1, 3, 1, 1)

    def load(self, path):
        m = fold_identity_weights(onnx.load(path))
        net = convert(m).to(self.dev).eval()
        inits = {i.name for i in m.graph.initializer}
        net.spn_inputs = [i.name for i in m.graph.input if i.name not in inits]
        return net

    def run_w2l(self, net, prec, mel, face):
        """Wav2Lip with its two inputs in the export's order (by name)."""
        args = [mel if n == "mel" or "audio" in n else face for n in net.spn_inputs]
        return self.run_model(net, prec, *args)

    def precision(self, p):
        # fp16 = autocast (what a torch team writes); like Spindle, the CPU
        # computes in fp32 whatever the config asks
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        torch.backends.cudnn.allow_tf32 = p == "tf32"
        return torch.autocast("cuda", dtype=torch.float16, enabled=self.cuda and p == "fp16")

    def run_model(self, net, prec, *xs):
        with torch.inference_mode(), self.precision(prec):
            return net(*xs)

    # ---- face detection
    def setup_detector(self, model, fd_cfg):
        self.fd_cfg = fd_cfg
        self.fd_prec = precision_of(fd_cfg)
        if model and not model.startswith("builtin:"):
            self.fd_kind = "retinaface"
            self.fd_net = self.load(model)
            self.fd_priors = {}
            self.fd_mean = self.fd_means()
        else:
            # Spindle fell back to its Haar cascade: the same cascade in OpenCV
            self.fd_kind = "haar"
            if not hasattr(cv2, "CascadeClassifier"):
                raise RuntimeError(f"OpenCV {cv2.__version__} has no Haar cascade: fetch retinaface-mnet025 "
                                   "(spindle model fetch) so that both sides run RetinaFace")
            names = [fd_cfg.get("cascade")] if fd_cfg.get("cascade") else [
                os.path.join(getattr(getattr(cv2, "data", None), "haarcascades", ""), HAAR),
                "/usr/share/opencv4/haarcascades/" + HAAR, "/usr/share/opencv/haarcascades/" + HAAR]
            xml = next((n for n in names if os.path.exists(n)), names[0])
            self.haar = cv2.CascadeClassifier(xml)

    def priors(self, h, w):
        key = (h, w)
        if key not in self.fd_priors:
            out = []
            for step, sizes in ((8, (16, 32)), (16, (64, 128)), (32, (256, 512))):
                fh, fw = -(-h // step), -(-w // step)
                jj, ii = np.meshgrid(np.arange(fw), np.arange(fh))
                for_sizes = []
                for s in sizes:
                    for_sizes.append(np.stack([(jj + 0.5) * step / w, (ii + 0.5) * step / h,
                                               np.full(jj.shape, s / w), np.full(jj.shape, s / h)], -1))
                out.append(np.stack(for_sizes, 2).reshape(-1, 4))
            self.fd_priors[key] = np.concatenate(out).astype(np.float32)
        return self.fd_priors[key]

    def detect(self, frames):
        """One list of (x1, y1, x2, y2, score) per frame, largest first."""
        thr = float(self.fd_cfg.get("score_threshold", 0.5))
        nms_thr = float(self.fd_cfg.get("nms_threshold", 0.4))
        top_k = int(self.fd_cfg.get("top_k", 5000))
        max_faces = int(self.fd_cfg.get("max_faces", 0))
        out = []
        if self.fd_kind == "haar":
            for f in frames:
                g = cv2.cvtColor(f, cv2.COLOR_BGR2GRAY)
                r = self.haar.detectMultiScale(g, float(self.fd_cfg.get("scale_factor", 1.1)),
                                               int(self.fd_cfg.get("min_neighbors", 3)))
                boxes = [(x, y, x + w, y + h, 1.0) for (x, y, w, h) in r]
                boxes.sort(key=lambda b: -(b[2] - b[0]) * (b[3] - b[1]))
                out.append(boxes[:max_faces] if max_faces else boxes)
            return out
        h, w = frames[0].shape[:2]
        p = self.priors(h, w)
        for i in range(0, len(frames), FD_BATCH):
            x = self.fd_input(frames[i:i + FD_BATCH])
            loc, conf, _ = self.run_model(self.fd_net, self.fd_prec, x)
            loc, conf = self.host(loc), self.host(conf)[..., 1]
            for b in range(loc.shape[0]):
                idx = np.where(conf[b] > thr)[0]
                idx = idx[conf[b][idx].argsort()[::-1][:top_k]]
                l, pr = loc[b][idx], p[idx]
                c = pr[:, :2] + l[:, :2] * 0.1 * pr[:, 2:]
                s = pr[:, 2:] * np.exp(l[:, 2:] * 0.2)
                boxes = np.concatenate([c - s / 2, c + s / 2], 1) * np.array([w, h, w, h], np.float32)
                keep = nms(boxes, conf[b][idx], nms_thr)
                faces = [(*boxes[k], float(conf[b][idx][k])) for k in keep]
                faces.sort(key=lambda f: -(f[2] - f[0]) * (f[3] - f[1]))
                out.append(faces[:max_faces] if max_faces else faces)
        return out

    # ---- encoder subprocess
    def open_writer(self, how, path, w, h, fps, enc_cfg, audio, spindle):
        codec = enc_cfg.get("codec", "libx264")
        preset, crf = enc_cfg.get("preset", "medium"), int(enc_cfg.get("crf", 23))
        if how == "ffmpeg":
            args = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
                    "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{w}x{h}", "-r", str(fps), "-i", "pipe:0"]
            if audio:
                args += ["-i", audio, "-map", "0:v:0", "-map", "1:a:0", "-c:a", "aac"]
            args += ["-c:v", codec, "-preset", preset, "-crf", str(crf), "-pix_fmt", "yuv420p",
                     "-movflags", "+faststart", path]
            return Writer(subprocess.Popen(args, stdin=subprocess.PIPE), None, "bgr24")
        if how == "spindle":
            cfg = os.path.join(os.path.dirname(path), "peer-encode.toml")
            with open(cfg, "w") as f:
                f.write(PEER_ENCODE_TOML)
            args = [spindle, "run", cfg, "--devices", "cpu", "--log-format", "json",
                    "--set", "decode.path=pipe:0", "--set", f"encode.path={path}",
                    "--set", f"encode.codec={codec}", "--set", f"encode.preset={preset}",
                    "--set", f"encode.crf={crf}", "--set", f"encode.fps={fps}"]
            if audio:
                args += ["--set", f"encode.audio_path={audio}"]
            p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
            p.stdin.write(f"YUV4MPEG2 W{w} H{h} F{int(round(fps * 1000))}:1000 Ip A1:1 C420jpeg\n".encode())
            return Writer(p, None, "y4m")
        fourcc = cv2.VideoWriter_fourcc(*"mp4v")
        return Writer(None, cv2.VideoWriter(path, fourcc, fps, (w, h)), "cv2")


PEER_ENCODE_TOML = """# the Python peer's encoder: YUV4MPEG frames on stdin -> libx264
[pipeline]
name = "peer-encode"
[[stage]]
name = "decode"
kind = "decode"
path = "pipe:0"
pixel_format = "rgb24"
audio = false
[[stage]]
name = "encode"
kind = "encode"
inputs = ["decode.video"]
path = "out.mp4"
"""


class Writer:
    def __init__(self, proc, vw, fmt):
        self.proc, self.vw, self.fmt = proc, vw, fmt

    def write(self, bgr):
        if self.vw is not None:
            self.vw.write(bgr)
        elif self.fmt == "bgr24":
            self.proc.stdin.write(memoryview(np.ascontiguousarray(bgr)))
        else:
            self.proc.stdin.write(b"FRAME\n")
            self.proc.stdin.write(memoryview(cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)))

    def close(self):
        if self.vw is not None:
            self.vw.release()
            return 0
        self.proc.stdin.close()
        return self.proc.wait()


def fold_identity_weights(m):
    """Identity nodes that only rename an initializer (the PyTorch exporter
    writes them for shared weights) become initializers: onnx2torch wants a
    Conv's weight as an initializer."""
    inits = {i.name: i for i in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "Identity" and n.input[0] in inits:
            t = onnx.TensorProto()
            t.CopyFrom(inits[n.input[0]])
            t.name = n.output[0]
            m.graph.initializer.append(t)
            inits[t.name] = t
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def nms(boxes, scores, thr):
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        xx1, yy1 = np.maximum(x1[i], x1[order[1:]]), np.maximum(y1[i], y1[order[1:]])
        xx2, yy2 = np.minimum(x2[i], x2[order[1:]]), np.minimum(y2[i], y2[order[1:]])
        inter = np.maximum(0.0, xx2 - xx1 + 1) * np.maximum(0.0, yy2 - yy1 + 1)
        order = order[np.where(inter / (areas[i] + areas[order[1:]] - inter) <= thr)[0] + 1]
    return keep


def feather_mask(h, w, feather):
    """(h,w,1) float32 weights: 1 inside, ramping to 0 over `feather` pixels at the edges."""
    if feather <= 0:
        return np.ones((h, w, 1), np.float32)
    y = np.minimum(np.arange(h) + 0.5, h - np.arange(h) - 0.5) / feather
    x = np.minimum(np.arange(w) + 0.5, w - np.arange(w) - 0.5) / feather
    return np.clip(np.minimum(y[:, None], x[None, :]), 0, 1)[..., None].astype(np.float32)


def paste(dst, src, x1, y1, feather):
    h, w = src.shape[:2]
    region = dst[y1:y1 + h, x1:x1 + w]
    m = feather_mask(h, w, feather)
    region[:] = (src * m + region * (1 - m) + 0.5).astype(np.uint8)


def read_frames(clip, n):
    cap = cv2.VideoCapture(clip)
    frames = []
    while n <= 0 or len(frames) < n:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    cap.release()
    return frames


class OrtPeer(Peer):
    """The same pipeline with the models in ONNX Runtime on the CPU (what a
    Python team without a GPU runs: ORT's CPU provider with its default
    threads, NumPy arrays in and out). Same files, same steps; nothing
    crosses a bus, so no bytes are counted."""

    def __init__(self, threads=0, w2l_batch=128):
        self.cuda = False
        self.threads = threads
        self.common_init(w2l_batch)

    def up(self, a):
        return np.ascontiguousarray(a)

    def down(self, t):
        return t

    def sync(self):
        pass

    def host(self, t):
        return np.asarray(t, np.float32)

    def fd_means(self):
        return np.array([104.0, 117.0, 123.0], np.float32).reshape(1, 3, 1, 1)

    def fd_input(self, frames):
        return np.ascontiguousarray(np.stack(frames).transpose(0, 3, 1, 2).astype(np.float32) - self.fd_mean)

    def sr_frame(self, net, prec, bgr):
        x = np.ascontiguousarray(bgr[:, :, ::-1].transpose(2, 0, 1)[None], np.float32) / 255.0
        y = self.run_model(net, prec, x)
        y = (np.clip(y[0], 0, 1) * 255.0).round().astype(np.uint8).transpose(1, 2, 0)
        return np.ascontiguousarray(y[:, :, ::-1])

    def no_grad(self):
        return contextlib.nullcontext()

    def load(self, path):
        so = ort.SessionOptions()
        if self.threads:
            so.intra_op_num_threads = self.threads
        net = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        net.spn_inputs = [i.name for i in net.get_inputs()]
        return net

    def run_model(self, net, prec, *xs):
        # the CPU computes in fp32 whatever the config asks, as Spindle's does
        out = net.run(None, {n: np.ascontiguousarray(x, np.float32) for n, x in zip(net.spn_inputs, xs)})
        return out[0] if len(out) == 1 else out


def peer_enhance(peer, clip, n, doc, models, writer_kind, out, spindle):
    fd, sr, enc = stage_of(doc, "faces"), stage_of(doc, "sr"), stage_of(doc, "encode")
    scale, margin, feather = int(sr.get("scale", 2)), float(sr.get("face_margin", 0.25)), float(sr.get("feather", 8))
    sr_model = models.get("sr", "")
    sr_path = os.path.join(SRC, "models", "espcn-x2.onnx") if sr_model.startswith("builtin:") else sr_model
    sr_prec = precision_of(sr)
    peer.setup_detector(models.get("faces", "builtin: Haar"), fd)
    sr_net = peer.load(sr_path)
    cap = cv2.VideoCapture(clip)
    ok, first = cap.read()
    cap.release()
    h, w = first.shape[:2]
    # warm-up, outside the clock: one detection batch, one face-sized SR run
    peer.detect([first] * min(FD_BATCH, 2))
    peer.sr_frame(sr_net, sr_prec, first[: h // 3, : w // 4])
    peer.sync()
    peer.h2d = peer.d2h = 0
    peer.phase = {}

    t0 = time.perf_counter()
    frames = peer.timed("read", read_frames, clip, n)
    faces = peer.timed("detect", peer.detect, frames)
    wr = peer.open_writer(writer_kind, out, w * scale, h * scale, 25.0, enc, clip, spindle)
    n_faces = 0
    for f, boxes in zip(frames, faces):
        up = peer.timed("paste", cv2.resize, f, (w * scale, h * scale), None, 0, 0, cv2.INTER_LINEAR)
        for (x1, y1, x2, y2, _) in boxes:
            mx, my = (x2 - x1) * margin, (y2 - y1) * margin
            a, b = int(max(0, x1 - mx)), int(max(0, y1 - my))
            c, d = int(min(w, np.ceil(x2 + mx))), int(min(h, np.ceil(y2 + my)))
            if c - a < 2 or d - b < 2:
                continue
            n_faces += 1
            s = peer.timed("sr", peer.sr_frame, sr_net, sr_prec, f[b:d, a:c])
            peer.timed("paste", paste, up, s, a * scale, b * scale, feather)
        peer.timed("encode", wr.write, up)
    rc = peer.timed("encode", wr.close)
    t = time.perf_counter() - t0
    if rc:
        raise RuntimeError(f"peer encoder exited {rc}")
    return len(frames), t, {"faces": n_faces, "sr_model": sr_path}


def mel_chunks(peer, wav, fps, n):
    with wave.open(wav, "rb") as f:
        assert f.getframerate() == 16000 and f.getnchannels() == 1 and f.getsampwidth() == 2, wav
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768.0
    mel = peer.mel_mod.reference(x).astype(np.float32)  # (80, T), Wav2Lip's audio.melspectrogram
    chunks, i = [], 0
    while len(chunks) < n:
        start = int(i * 80.0 / fps)
        if start + 16 > mel.shape[1]:
            chunks.append(mel[:, -16:])
            break
        chunks.append(mel[:, start:start + 16])
        i += 1
    return chunks


def peer_lipsync(peer, clip, wav, n, doc, models, w2l, writer_kind, out, spindle):
    fd, lips, sr, enc = (stage_of(doc, k) for k in ("faces", "lips", "sr", "encode"))
    # melspec's fps = 0 (the shipped config) cuts the chunks at the video's rate, as Wav2Lip does
    fps = float(stage_of(doc, "melspec").get("fps", 0.0))
    if fps <= 0:
        cap = cv2.VideoCapture(clip)
        fps = cap.get(cv2.CAP_PROP_FPS) or 25.0
        cap.release()
    pads = [int(lips.get(k, 0)) for k in ("pad_top", "pad_bottom", "pad_left", "pad_right")]
    batch, feather = int(lips.get("batch_size", 128)), float(lips.get("feather", 4.0))
    win = int(fd.get("smooth_window", 5))
    scale = int(sr.get("scale", 2))
    sr_model = models.get("sr") or os.path.join(SRC, "configs", sr["model"])
    sr_path = os.path.join(SRC, "models", "espcn-x2.onnx") if sr_model.startswith("builtin:") else sr_model
    peer.setup_detector(models.get("faces", "builtin: Haar"), fd)
    w2l_net, sr_net = peer.load(w2l), peer.load(sr_path)
    w2l_prec, sr_prec = precision_of(lips), precision_of(sr)
    cap = cv2.VideoCapture(clip)
    ok, first = cap.read()
    cap.release()
    h, w = first.shape[:2]
    peer.detect([first] * 2)
    peer.run_w2l(w2l_net, w2l_prec, peer.up(np.zeros((batch, 1, 80, 16), np.float32)),
                 peer.up(np.zeros((batch, 6, 96, 96), np.float32)))
    peer.sr_frame(sr_net, sr_prec, first)
    peer.sync()
    peer.h2d = peer.d2h = 0
    peer.phase = {}

    t0 = time.perf_counter()
    frames = peer.timed("read", read_frames, clip, n)
    mels = peer.timed("mel", mel_chunks, peer, wav, fps, len(frames))
    frames = frames[:len(mels)]
    found = peer.timed("detect", peer.detect, frames)
    # boxes: padded as Wav2Lip's --pads, averaged over the next `win` frames
    rects = []
    for fs in found:
        if not fs:
            rects.append(None)
            continue
        x1, y1, x2, y2 = fs[0][:4]
        rects.append((max(0, y1 - pads[0]), min(h, y2 + pads[1]), max(0, x1 - pads[2]), min(w, x2 + pads[3])))
    sm = []
    for i, r in enumerate(rects):
        if r is None:
            sm.append(None)
            continue
        near = [q for q in rects[i:i + win] if q is not None]
        y1, y2, x1, x2 = (int(v) for v in np.mean(near, 0))
        sm.append((y1, y2, x1, x2) if y2 - y1 >= 2 and x2 - x1 >= 2 else None)
    wr = peer.open_writer(writer_kind, out, w * scale, h * scale, fps, enc, wav, spindle)
    for i in range(0, len(frames), batch):
        idx = [j for j in range(i, min(i + batch, len(frames))) if sm[j] is not None]
        if idx:
            def prepare():
                face = np.stack([cv2.resize(frames[j][sm[j][0]:sm[j][1], sm[j][2]:sm[j][3]], (96, 96)) for j in idx])
                masked = face.copy()
                masked[:, 48:] = 0
                img = np.concatenate([masked, face], 3).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
                mel = np.stack([mels[j] for j in idx])[:, None].astype(np.float32)
                return img, mel
            img, mel = peer.timed("prepare", prepare)

            def infer():
                pred = peer.run_w2l(w2l_net, w2l_prec, peer.up(mel), peer.up(img))
                return peer.host(pred).transpose(0, 2, 3, 1) * 255.0
            pred = peer.timed("wav2lip", infer)

            def paste_all():
                for p, j in zip(pred, idx):
                    y1, y2, x1, x2 = sm[j]
                    frames[j] = frames[j].copy()
                    paste(frames[j], cv2.resize(p.astype(np.uint8), (x2 - x1, y2 - y1)), x1, y1, feather)
            peer.timed("paste", paste_all)
        for j in range(i, min(i + batch, len(frames))):
            up = peer.timed("sr", peer.sr_frame, sr_net, sr_prec, frames[j])
            peer.timed("encode", wr.write, up)
    rc = peer.timed("encode", wr.close)
    t = time.perf_counter() - t0
    if rc:
        raise RuntimeError(f"peer encoder exited {rc}")
    return len(frames), t, {"faces": sum(1 for r in sm if r is not None), "sr_model": sr_path}


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--clips", required=True)
    ap.add_argument("--out", default="pipeline-gpu-bench.json")
    ap.add_argument("--devices", default="cuda")
    ap.add_argument("--frames", type=int, default=0, help="at most N frames of each clip (0: all)")
    ap.add_argument("--pipelines", default="enhance,lipsync")
    ap.add_argument("--w2l", help="a Wav2Lip ONNX export (default: random weights of the real shape)")
    ap.add_argument("--encoder", default="auto", choices=("auto", "ffmpeg", "spindle", "cv2"),
                    help="the peer's encoder (auto: ffmpeg CLI if on PATH, else spindle)")
    ap.add_argument("--workdir")
    ap.add_argument("--set", action="append", default=[], metavar="STAGE.KEY=VALUE",
                    help="passed to Spindle's runs (repeatable; encode.* to the full run only), e.g. "
                         "encode.hwaccel=none on a GPU with NVENC so both sides encode with libx264")
    ap.add_argument("--repeat", type=int, default=2,
                    help="Spindle's runs are `spindle run --repeat N`: N jobs on the pipeline loaded once; the "
                         "figures are the last job's (models resident and warm, as on a worker; the Python side's "
                         "models are warmed before its clock too), the first job's frames/s is shown as cold")
    ap.add_argument("--gpu-decode-both", action="store_true",
                    help="also run the GPU part with faces.gpu_decode=false (the detector's raw outputs copied "
                         "back and decoded on the host) and report both")
    ap.add_argument("--peer-engine", default="auto", choices=("auto", "torch", "ort"),
                    help="the Python pipeline's models: PyTorch (onnx2torch) or ONNX Runtime's CPU provider "
                         "(auto: torch with --devices cuda, ONNX Runtime with --devices cpu)")
    ap.add_argument("--peer-threads", type=int, default=0,
                    help="ONNX Runtime's intra-op threads for the peer (0: its default, one per core)")
    ap.add_argument("--log-level", default="info", choices=("debug", "info", "warn", "error"),
                    help="Spindle's runs' --log-level; debug also prints the sizes of lipsync's Wav2Lip batches")
    ap.add_argument("--no-peer", action="store_true",
                    help="Spindle's runs only, no Python pipeline (for comparing Spindle's settings with each "
                         "other; the ratio column then stays empty)")
    a = ap.parse_args()
    if tomllib is None:
        print("SKIP: needs Python 3.11 (tomllib)")
        return 77
    cuda = a.devices.startswith("cuda")
    engine = a.peer_engine if a.peer_engine != "auto" else "torch" if cuda else "ort"
    if engine == "ort" and cuda:
        print("--peer-engine ort runs on the CPU: with --devices cuda the peer is torch")
        return 2
    if engine == "torch" and torch is None:
        print(f"SKIP: the torch peer needs torch and onnx2torch ({TORCH_MISSING})")
        return 77
    if engine == "ort" and ort is None:
        print(f"SKIP: the ONNX Runtime peer needs onnxruntime ({ORT_MISSING})")
        return 77
    if cuda and not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77
    build = os.path.abspath(a.build)
    spindle = os.path.join(build, "core", "cli", "spindle")
    clips = sorted(glob.glob(os.path.join(a.clips, "talking-head-*p.mp4")),
                   key=lambda p: int(re.search(r"-(\d+)p\.mp4$", p).group(1)))
    wav = os.path.join(a.clips, "speech.wav")
    if not clips or not os.path.exists(wav):
        print(f"no talking-head-*p.mp4 and speech.wav in {a.clips}: make them with tools/make-bench-clips.sh")
        return 2
    enc_kind = a.encoder
    if enc_kind == "auto":
        enc_kind = "ffmpeg" if shutil.which("ffmpeg") else "spindle"
    pipelines = [p for p in a.pipelines.split(",") if p]
    work = a.workdir or tempfile.mkdtemp(prefix="spn-pipeline-bench-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    w2l = a.w2l
    if "lipsync" in pipelines and not w2l:
        w2l = os.path.join(work, "w2l-random.onnx")
        subprocess.run([sys.executable, os.path.join(SRC, "tests", "lipsync", "make-w2l-model.py"), w2l,
                        "--arch", "wav2lip", "--width", "1.0"], check=True, stdout=subprocess.DEVNULL)
    torch_dev = "cuda:0" if cuda else "cpu"
    nvml = NvmlPcie.create() if cuda else None
    gpu = torch.cuda.get_device_name(0) if cuda else "CPU"
    peer_lib = f"torch {torch.__version__}" if engine == "torch" else f"onnxruntime {ort.__version__}"
    print(f"device: {a.devices} ({gpu}); peer models: {peer_lib}, cv2 {cv2.__version__}; "
          f"peer encoder: {enc_kind}; Wav2Lip: {a.w2l or 'random weights, real shape'}")
    results = []
    for pipe in pipelines:
        cfg = os.path.join(SRC, "configs", f"{pipe}.toml")
        doc = read_config(cfg)
        sink_cfg = counting_sink_config(cfg, os.path.join(work, f"{pipe}-sink.toml"))
        for clip in clips:
            cap = cv2.VideoCapture(clip)
            W, H = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
            fps = cap.get(cv2.CAP_PROP_FPS) or 25.0
            cap.release()
            tag = f"{pipe}-{H}p"
            sets = [f"decode.path={clip}"]
            if a.frames:
                sets.append(f"decode.duration={(a.frames - 0.5) / fps:.4f}")
            if pipe == "lipsync":
                sets += [f"lips.model={w2l}", f"melspec.path={wav}", f"melspec.video={clip}"]
            # --set: the encoder's keys go to the full run only (the GPU part's
            # encode is a counting filesink)
            full_sets = sets + list(a.set) + [f"encode.path={os.path.join(work, tag + '-spindle.mp4')}",
                                f"encode.audio_path={wav if pipe == 'lipsync' else clip}"]
            r = {"pipeline": pipe, "clip": os.path.basename(clip), "width": W, "height": H, "devices": a.devices,
                 "gpu": gpu, "scale": int(stage_of(doc, "sr").get("scale", 2))}
            try:
                full = run_spindle(spindle, cfg, full_sets, a.devices, env, os.path.join(work, tag + "-full.log"),
                                   nvml, a.repeat, a.log_level)
                sets += [x for x in a.set if not x.startswith("encode.")]
                part = run_spindle(spindle, sink_cfg, sets, a.devices, env, os.path.join(work, tag + "-gpupart.log"),
                                   nvml, a.repeat, a.log_level)
            except RuntimeError as e:
                print(f"{tag}: {e}")
                r["error"] = str(e)
                results.append(r)
                continue
            xfer, xsrc = transfers(full)
            r["spindle"] = {"frames": full["frames"], "elapsed_s": full["elapsed_s"],
                            "frames_per_s": full["frames"] / full["elapsed_s"], "stages": full["stages"],
                            "cold": full.get("cold"),
                            "models": full["models"], "transfers_per_frame": xfer, "transfers_source": xsrc,
                            "lips_batches": full["lips_batches"], "summary": full}
            if "nvml_pcie" in full:
                r["spindle"]["nvml_pcie_per_frame"] = {k: full["nvml_pcie"][k] / max(1, full["frames"])
                                                       for k in ("h2d", "d2h")}
            pxfer, _ = transfers(part)
            r["gpu_part"] = {"frames": part["frames"], "elapsed_s": part["elapsed_s"],
                             "frames_per_s": part["frames"] / part["elapsed_s"], "stages": part["stages"],
                             "cold": part.get("cold"), "lips_batches": part["lips_batches"],
                             "transfers_per_frame": pxfer, "summary": part}
            r["bounding_stage"] = bounding_stage(full)
            r["gpu_part"]["bounding_stage"] = bounding_stage(part)
            if a.gpu_decode_both:
                try:
                    hd = run_spindle(spindle, sink_cfg, sets + ["faces.gpu_decode=false"], a.devices, env,
                                     os.path.join(work, tag + "-gpupart-hostdecode.log"), nvml, a.repeat,
                                     a.log_level)
                    hx, _ = transfers(hd)
                    r["gpu_part_host_decode"] = {"frames": hd["frames"], "elapsed_s": hd["elapsed_s"],
                                                 "frames_per_s": hd["frames"] / hd["elapsed_s"],
                                                 "stages": hd["stages"], "transfers_per_frame": hx}
                except RuntimeError as e:
                    r["gpu_part_host_decode"] = {"error": str(e)}
            if a.no_peer:
                results.append(r)
                print(f"{tag}: spindle {r['spindle']['frames_per_s']:.1f} frames/s, GPU part "
                      f"{r['gpu_part']['frames_per_s']:.1f} frames/s (no Python peer)", flush=True)
                continue
            # the peer, on the same frames (Spindle's count)
            peer = Peer(torch_dev) if engine == "torch" else OrtPeer(a.peer_threads)
            out = os.path.join(work, tag + "-python.mp4")
            n = full["frames"] if a.frames else 0
            try:
                with peer.no_grad():
                    if pipe == "enhance":
                        pn, pt, extra = peer_enhance(peer, clip, n, doc, full["models"], enc_kind, out, spindle)
                    else:
                        pn, pt, extra = peer_lipsync(peer, clip, wav, n, doc, full["models"], w2l, enc_kind, out,
                                                     spindle)
            except Exception as e:  # report and go on with the other runs
                print(f"{tag}: python peer failed: {type(e).__name__}: {e}")
                r["python"] = {"error": f"{type(e).__name__}: {e}"}
                results.append(r)
                continue
            r["python"] = {"frames": pn, "elapsed_s": pt, "frames_per_s": pn / pt, "encoder": enc_kind,
                           "phases_s": peer.phase, "h2d_per_frame": peer.h2d / max(1, pn),
                           "d2h_per_frame": peer.d2h / max(1, pn), **extra}
            r["ratio"] = r["spindle"]["frames_per_s"] / r["python"]["frames_per_s"]
            results.append(r)
            cold = lambda k: f" (cold {r[k]['cold']['frames_per_s']:.1f})" if r[k].get("cold") else ""
            print(f"{tag}: spindle {r['spindle']['frames_per_s']:.1f} frames/s{cold('spindle')}, python "
                  f"{r['python']['frames_per_s']:.1f} frames/s, GPU part {r['gpu_part']['frames_per_s']:.1f} "
                  f"frames/s{cold('gpu_part')}", flush=True)

    with open(a.out, "w") as f:
        json.dump({"device": a.devices, "gpu": gpu, "peer_models": peer_lib, "peer_encoder": enc_kind,
                   "wav2lip": a.w2l or "random weights (tests/lipsync/make-w2l-model.py --arch wav2lip --width 1.0)",
                   "frames_limit": a.frames, "spindle_sets": a.set, "spindle_repeat": a.repeat,
                   "results": results}, f, indent=1)
    print_report(results, a, gpu, enc_kind)
    print(f"\nJSON: {a.out}; outputs and logs: {work}")
    return 0


def print_report(results, a, gpu, enc_kind):
    print(f"\n### Pipelines on {a.devices} ({gpu}); Python peer encoder: {enc_kind}\n")
    print("| pipeline | resolution | frames | Spindle frames/s | Python frames/s | ratio | PCIe bytes/frame "
          "| PCIe in frames (input / output size) | GPU part frames/s | bounding stage |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        res = f"{r['width']}x{r['height']}"
        if "spindle" not in r:
            print(f"| {r['pipeline']} | {res} | failed: {r.get('error', '')} |||||||")
            continue
        s, g = r["spindle"], r["gpu_part"]
        p = r.get("python", {})
        pf = f"{p['frames_per_s']:.1f}" if "frames_per_s" in p else "failed" if p else "-"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        x = s["transfers_per_frame"]["pcie"]
        mark = "" if s["transfers_source"].startswith("job") else " (" + s["transfers_source"] + ")"
        bn, bs = r["bounding_stage"]
        fin = x / (r["width"] * r["height"] * 3)
        fout = fin / (r["scale"] * r["scale"])
        print(f"| {r['pipeline']} | {res} | {s['frames']} | {s['frames_per_s']:.1f} | {pf} | {ratio} | "
              f"{x:,.0f}{mark} | {fin:.2f} / {fout:.2f} | {g['frames_per_s']:.1f} | {bn} ({100 * bs:.0f}%) |")
    if not a.devices.startswith("cuda"):
        print("\n(CPU run: the targets are the GPU's; the \"GPU part\" column is the pipeline without its encoder.)")
    else:
        print("\nTargets (met / missed): Spindle >= 5x the Python frames/s; GPU part >= 900 frames/s at 720p; "
              "at most one output frame over PCIe per output frame\n")
    for r in results:
        if "spindle" not in r or not a.devices.startswith("cuda"):
            continue
        x = r["spindle"]["transfers_per_frame"]["pcie"] / (r["width"] * r["height"] * 3 * r["scale"] ** 2)
        checks = [("ratio >= 5", r["ratio"] >= 5 if "ratio" in r else None),
                  ("PCIe <= 1 frame" + ("" if r["spindle"]["transfers_source"].startswith("job") else
                                        " (edges only)"), x <= 1.0)]
        if r["height"] == 720:
            checks.insert(1, ("GPU part >= 900 frames/s", r["gpu_part"]["frames_per_s"] >= 900))
        print(f"- {r['pipeline']} {r['width']}x{r['height']}: " +
              ", ".join(f"{n} {'-' if ok is None else 'met' if ok else 'missed'}" for n, ok in checks))
    hd = [r for r in results if "gpu_part_host_decode" in r]
    if hd:
        print("facedetect: candidates picked on the GPU (default) vs the raw outputs decoded on the host "
              "(gpu_decode = false), GPU part:\n")
        for r in hd:
            g, h = r["gpu_part"], r["gpu_part_host_decode"]
            if "error" in h:
                print(f"- {r['pipeline']} {r['width']}x{r['height']}: host decode run failed: {h['error']}")
                continue
            fd = {st["name"]: st["busy_ms"] for st in g["stages"]}
            fh = {st["name"]: st["busy_ms"] for st in h["stages"]}
            print(f"- {r['pipeline']} {r['width']}x{r['height']}: {g['frames_per_s']:.1f} vs "
                  f"{h['frames_per_s']:.1f} frames/s; faces stage {fd.get('faces', 0):.0f} vs "
                  f"{fh.get('faces', 0):.0f} ms; PCIe {g['transfers_per_frame']['pcie']:,.0f} vs "
                  f"{h['transfers_per_frame']['pcie']:,.0f} bytes/frame")
        print()
    print("\nPer run (Spindle: busy ms and share per stage; GPU part: the same without the encoder; "
          "Python: seconds per phase):\n")
    for r in results:
        if "spindle" not in r:
            continue
        s, g = r["spindle"], r["gpu_part"]
        print(f"- {r['pipeline']} {r['width']}x{r['height']}: models {s['models'] or '(none logged)'}")
        x = s["transfers_per_frame"]
        print("  - Spindle: " + ", ".join(f"{st['name']} {st['busy_ms']:.0f} ms ({100 * st['share']:.0f}%)"
                                           for st in s["stages"]) +
              f"; per frame h2d {x['h2d']:,.0f} B, d2h {x['d2h']:,.0f} B, "
              f"d2d {x['d2d']:,.0f} B ({s['transfers_source']})" +
              ("; NVML estimate h2d {h2d:,.0f} B, d2h {d2h:,.0f} B".format(**s["nvml_pcie_per_frame"])
               if "nvml_pcie_per_frame" in s else ""))
        gb, gs = g["bounding_stage"]
        print("  - GPU part: " + ", ".join(f"{st['name']} {st['busy_ms']:.0f} ms ({100 * st['share']:.0f}%)"
                                            for st in g["stages"]) + f"; bound by {gb}")
        for label, k in (("Spindle", s), ("GPU part", g)):
            lb = k.get("lips_batches") or []
            if lb:
                print(f"  - {label}, Wav2Lip runs of the last job: {len(lb)}, {sum(lb)} faces, mean "
                      f"{sum(lb) / len(lb):.1f}, largest {max(lb)}: {', '.join(map(str, lb[:40]))}"
                      f"{' ...' if len(lb) > 40 else ''}")
        for label, k in (("Spindle", s), ("GPU part", g)):
            b = stage_bounds(k)
            if b:
                print(f"  - {label}, busy time a frame: slowest stage {b['max_ms']:.2f} ms (at most "
                      f"{b['max_fps']:.0f} frames/s with the stages overlapping), all stages {b['sum_ms']:.2f} ms "
                      f"({b['sum_fps']:.0f} frames/s one after another); measured {k['frames_per_s']:.1f} "
                      f"(SPINDLE_DEVICE_THREADS={os.environ.get('SPINDLE_DEVICE_THREADS') or 'stage'})")
        for label, k in (("Spindle", s), ("GPU part", g)):
            sm = [(st["name"], st["stream_ms"]) for st in k.get("stages", []) if "stream_ms" in st]
            n = k.get("frames") or 0
            if sm and n:
                top, top_ms = max(sm, key=lambda x: x[1])
                print(f"  - {label}, stream time a frame (the device's time on each stage's work, "
                      "docs/gpu.md): " + ", ".join(f"{nm} {v / n:.2f} ms" for nm, v in sm) +
                      f"; all {sum(v for _, v in sm) / n:.2f} ms; the most: {top} "
                      f"({1000.0 * n / top_ms if top_ms > 0 else float('inf'):.0f} frames/s if its stream bounds "
                      "the pipeline)")
        for label, k in (("Spindle", s), ("GPU part", g)):
            c = k.get("cold")
            if c:
                why = " (cold: cuDNN algorithm choice, CUDA Graph capture)" if a.devices.startswith("cuda") else ""
                print(f"  - {label}, first run{why}: "
                      f"{c['frames_per_s']:.1f} frames/s; " +
                      ", ".join(f"{st['name']} {st['busy_ms']:.0f} ms" for st in c["stages"]))
        p = r.get("python", {})
        if "phases_s" in p:
            print("  - Python: " + ", ".join(f"{k} {v:.2f} s" for k, v in p["phases_s"].items()) +
                  f"; {p['faces']} faces; per frame h2d {p['h2d_per_frame']:,.0f} B, d2h {p['d2h_per_frame']:,.0f} B"
                  f"; encoder {p['encoder']}")
        elif p:
            print(f"  - Python: {p.get('error')}")


if __name__ == "__main__":
    sys.exit(main())
