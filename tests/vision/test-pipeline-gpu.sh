#!/usr/bin/env bash
# A shipped pipeline on a GPU (suite gpu; exits 77 without a CUDA device):
# configs/enhance.toml, or configs/lipsync.toml with a random-weight
# Wav2Lip-shaped model (tests/lipsync/make-w2l-model.py).
#   1. The pipeline with its encoder swapped for a raw filesink runs with
#      --devices cpu and with --devices cuda on the first 2 s of the sample;
#      frame by frame the GPU's output is within PSNR >= 40 dB of the CPU's
#      (the issue's bar), the model stages ran on cuda:0, and the summary
#      shows the frames reaching the CPU sink with one device-to-host copy
#      each (nothing else crossed PCIe on an edge). The summary describes
#      decode's video edges as device memory on the GPU (handed over as they
#      are) and every edge as host memory, without copies, on the CPU. For
#      lipsync: the only bytes lipsync itself uploads are melspec's
#      spectrogram, once (the mel chunks are cut from it on the GPU).
#      One exception, for lipsync: Wav2Lip's crop is the face box rounded to
#      whole pixels, and where a box edge lies within the detectors'
#      difference of .5 the CPU and the GPU crop a pixel apart, and the model
#      paints a different mouth. Such a frame may fall below 40 dB if its
#      boxes (decode -> faces -> metasink, run on each device) show exactly
#      that, and the frame outside both crops (plus the superres reach) is
#      still >= 40 dB; at most one frame in ten.
#   2. The config itself, unchanged (but for the Wav2Lip model's path), runs
#      with --devices cuda, writes as many frames as the CPU run, and moves
#      at most one output frame's bytes between host and GPU per output frame
#      (the job's transfers: edges and the stages' own copies); each model
#      stage's stream time is above zero and within the job's time.
#   test-pipeline-gpu.sh enhance|lipsync SPINDLE PLUGIN_DIRS SOURCE_ROOT
#   (PLUGIN_DIRS: the plugin folders, colon-separated)
# SPINDLE_TEST_DURATION shortens the 2 s (the runs on the fake GPU of
# tests/gpu/host-emu, whose convolutions are naive loops);
# SPINDLE_TEST_MIN_PSNR raises the 40 dB bar (every frame).
set -u
duration=${SPINDLE_TEST_DURATION:-2}
name=$1 spindle=$(realpath "$2") src=$(realpath "$4")
export SPINDLE_PLUGIN_PATH=$3
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
config=$src/configs/$name.toml
sets=()
stages="faces sr"
if [ "$name" = lipsync ]; then
  python3 "$src/tests/lipsync/make-w2l-model.py" w2l.onnx --arch wav2lip --width 0.25 >/dev/null ||
    { echo "skip: could not make the Wav2Lip-shaped model (no onnx package?)"; exit 77; }
  sets=(--set lips.model="$tmp/w2l.onnx")
  # lipsync logs no line with its device: a CPU lipsync between the GPU
  # stages would add a device-to-host copy per frame, which the edge count
  # below refuses
fi
python3 - "$config" raw.toml <<'PY' || fail "could not derive the raw pipeline from $config"
import os, re, sys
text = open(sys.argv[1]).read()
head, sep, rest = text.partition('name = "encode"')
assert sep, 'no encode stage'
feeds = re.search(r'inputs = \["([A-Za-z0-9_-]+\.[A-Za-z0-9_]+)"\]', rest)
assert feeds, 'the encode stage has no inputs = ["stage.port"]'
head = head[:head.rindex('[[stage]]')]
head = head.replace('"encode.path"', '"raw.path"')
head = re.sub(r'(?m)^soundtrack = .*"encode\.audio_path".*\n', '', head)
root = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
head = head.replace('"../', '"' + root + '/')  # the config's relative paths, from the copy's folder
open(sys.argv[2], 'w').write(head + '[[stage]]\nname = "raw"\nkind = "filesink"\ninputs = ["%s"]\n' % feeds.group(1))
PY
run() { # DEVICES OUT
  "$spindle" run raw.toml --devices "$1" --set raw.path="$tmp/$2" --set decode.duration="$duration" "${sets[@]}" \
    --log-format json >"$2.json" 2>"$2.err"
}
run cuda gpu.rgb
rc=$?
if [ $rc -ne 0 ] && grep -q "no CUDA device\|CUDA engine backend is not built" gpu.rgb.err; then
  echo "skip: no CUDA device: $(grep -o 'no CUDA device[^"]*' gpu.rgb.err | head -1)"
  exit 77
fi
[ $rc -eq 0 ] || fail "GPU run: exit $rc: $(tail -3 gpu.rgb.err)"
run cpu cpu.rgb || fail "CPU run: exit $?: $(tail -3 cpu.rgb.err)"
if [ "$name" = lipsync ]; then
  # the faces each device's detector gave, for the crop rule above
  python3 - raw.toml boxes.toml <<'PY' || fail "could not derive the boxes pipeline from raw.toml"
import re, sys
blocks = open(sys.argv[1]).read().split('[[stage]]\n')
keep = [b for b in blocks[1:] if re.match(r'name = "(decode|faces)"\n', b)]
assert len(keep) == 2, 'no decode and faces stages'
open(sys.argv[2], 'w').write('[pipeline]\nname = "boxes"\n\n' + ''.join('[[stage]]\n' + b for b in keep) +
                             '[[stage]]\nname = "boxes"\nkind = "metasink"\ninputs = ["faces.faces"]\n')
PY
  for d in cpu cuda; do
    "$spindle" run boxes.toml --devices $d --set boxes.path="$tmp/$d.boxes" --set decode.duration="$duration" \
      >boxes-$d.out 2>&1 || fail "faces alone on $d: exit $?: $(tail -3 boxes-$d.out)"
  done
fi
python3 - "$tmp" $stages <<'PY' || fail "comparison failed"
import json, math, os, re, sys
import numpy as np
tmp, stages = sys.argv[1], sys.argv[2:]
res = {k: json.load(open(f'{tmp}/{k}.rgb.json')) for k in ('cpu', 'gpu')}
frames = [r.get('frames') for r in res.values()]
assert frames[0] == frames[1] and frames[0], f'frame counts {frames}'
n = frames[0]
a = np.fromfile(f'{tmp}/cpu.rgb', np.uint8)
b = np.fromfile(f'{tmp}/gpu.rgb', np.uint8)
assert a.size == b.size and a.size % n == 0, f'sizes {a.size} {b.size}'
a, b = a.reshape(n, -1).astype(np.float64), b.reshape(n, -1).astype(np.float64)
def psnr_of(mse):
    return np.where(mse == 0, np.inf, 10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-12)))
psnr = psnr_of(((a - b) ** 2).mean(axis=1))
fin = psnr[np.isfinite(psnr)]
print(f'{n} frames: PSNR gpu vs cpu min {psnr.min():.2f} dB, mean {fin.mean() if fin.size else float("inf"):.2f} dB')
if psnr.min() < 40.0:
    # where the worst frames differ: a region (the crop, a face box that
    # moved) or everywhere (a colour or scaling slip)
    px = a.shape[1] // 3
    w = next((w for w in range(int(px ** 0.5), px + 1) for r in (1.0, 16 / 9, 4 / 3)
              if px % w == 0 and abs(w / (px // w) - r) < 0.01), 0) if px else 0
    for f in np.argsort(psnr)[:3]:
        if psnr[f] >= 40.0 or not w:
            break
        d = np.abs(a[f] - b[f]).reshape(px // w, w, 3).max(axis=2)
        ys, xs = np.nonzero(d > 16)
        where = (f'{ys.size} pixels over 16 levels in x {xs.min()}..{xs.max()}, y {ys.min()}..{ys.max()} '
                 f'of {w}x{px // w}' if ys.size else 'no pixel over 16 levels')
        print(f'frame {int(f)}: {psnr[f]:.2f} dB, max difference {int(d.max())}; {where}')
low = [int(f) for f in np.nonzero(psnr < 40.0)[0]]
if low and os.path.exists(f'{tmp}/cpu.boxes'):
    # lipsync: a frame below 40 dB passes only when its crop moved by the
    # rounding of a box edge that sits at .5 (see the header), the rest of
    # the frame agrees, and such frames are rare
    raw = open(f'{tmp}/raw.toml').read()
    lips = raw[raw.index('kind = "lipsync"'):]
    lips = lips[:lips.find('[[stage]]') if '[[stage]]' in lips else len(lips)]
    pad = {k: int(re.search(rf'pad_{k} = (\d+)', lips).group(1)) for k in ('top', 'bottom', 'left', 'right')}
    boxes = {}
    for d in ('cpu', 'cuda'):
        lines = [json.loads(l) for l in open(f'{tmp}/{d}.boxes')]
        assert len(lines) == n, f'{d}.boxes: {len(lines)} frames, want {n}'
        boxes[d] = [l['faces'][0]['box'] if l['faces'] else None for l in lines]
    px = a.shape[1] // 3
    w = int(round(px ** 0.5))  # the sample is square
    assert w * w == px, f'{px} pixels a frame: not the square sample'
    scale = 2 if 'kind = "superres"' in raw else 1
    src = w // scale
    def crop(b):  # spn_w2l_crop_rect: edges rounded half up, then padded
        r = lambda v: math.floor(v + 0.5)
        return (max(r(b[0]) - pad['left'], 0), max(r(b[1]) - pad['top'], 0),
                min(r(b[2]) + pad['right'], src), min(r(b[3]) + pad['bottom'], src))
    reach = 5  # source pixels: the crop's one-pixel shift and the superres kernels' reach
    for f in low:
        bc, bg = boxes['cpu'][f], boxes['cuda'][f]
        assert bc and bg, f'frame {f} at {psnr[f]:.2f} dB and a device found no face there: cpu {bc}, cuda {bg}'
        cc, cg = crop(bc), crop(bg)
        near = [k for k in range(4) if cc[k] != cg[k] or
                min(abs(v - math.floor(v) - 0.5) for v in (bc[k], bg[k])) <= 0.02]
        assert near, (f'frame {f} at {psnr[f]:.2f} dB, but its box edges are not at .5 (the crops agree): '
                      f'cpu {bc}, cuda {bg}')
        x0, y0 = (max(min(cc[0], cg[0]) - reach, 0) * scale, max(min(cc[1], cg[1]) - reach, 0) * scale)
        x1, y1 = (min(max(cc[2], cg[2]) + reach, src) * scale, min(max(cc[3], cg[3]) + reach, src) * scale)
        out = np.ones((w, w), bool)
        out[y0:y1, x0:x1] = False
        fa, fb = a[f].reshape(w, w, 3)[out], b[f].reshape(w, w, 3)[out]
        p = float(psnr_of(((fa - fb) ** 2).mean()))
        print(f'frame {f}: {psnr[f]:.2f} dB; crop cpu {cc}, cuda {cg} (edges {near} at .5: boxes cpu '
              f'{[round(v, 4) for v in bc]}, cuda {[round(v, 4) for v in bg]}); outside both crops {p:.2f} dB')
        assert p >= 40.0, f'frame {f}: {p:.2f} dB outside the crops, want >= 40'
    assert len(low) <= max(1, n // 10), f'{len(low)} of {n} frames below 40 dB (crop rounding explains one in ten)'
    low = []
assert not low, f'frame {int(psnr.argmin())} at {psnr.min():.2f} dB'
# a stricter bar where the two runs should agree more closely than the
# issue's 40 dB (SPINDLE_TEST_MIN_PSNR; the fake GPU with NVDEC emulated)
bar = float(os.environ.get('SPINDLE_TEST_MIN_PSNR', '40'))
assert psnr.min() >= bar, f'frame {int(psnr.argmin())} at {psnr.min():.2f} dB, want >= {bar} (SPINDLE_TEST_MIN_PSNR)'
edges = res['gpu'].get('edges', [])
sink = [e for e in edges if e['to'] == 'raw']
assert sink and sink[0]['d2h']['copies'] == n, f'the edge into the sink: {sink}'
d2h = sum(e['d2h']['copies'] for e in edges)
h2d = sum(e['h2d']['copies'] for e in edges)
assert d2h == n, f'{d2h} device-to-host copies on edges, want {n} (one per frame)'
assert h2d == 0, f'{h2d} host-to-device copies on edges, want none (decode gives frames on the GPU)'
print(f'edges: {h2d} host-to-device and {d2h} device-to-host copies for {n} frames')
dirs = ('h2d', 'd2h', 'd2d', 'h2h')
dec = [e for e in edges if e['from'] == 'decode' and e['from_port'] == 'video']
assert dec, f'no edge from decode.video: {edges}'
for e in dec:
    assert e['memory'] == 'device' and not any(e[d]['copies'] for d in dirs), \
        f"decode.video -> {e['to']}.{e['to_port']} on the GPU: {e['memory']} memory, copies {[e[d] for d in dirs]}"
for e in res['cpu'].get('edges', []):
    assert e['memory'] == 'host' and not any(e[d]['copies'] for d in dirs), \
        f"{e['from']}.{e['from_port']} -> {e['to']}.{e['to_port']} on the CPU: {e['memory']} memory, " \
        f"copies {[e[d] for d in dirs]}"
# where each model stage ran: its log lines carry the device
log = open(f'{tmp}/gpu.rgb.err').read()
for s in stages:
    assert f'"stage":"{s}","device":"cuda:' in log or f'stage \\"{s}\\" (replica 0 on cuda:' in log, \
        f'no sign in the log that stage {s} ran on a GPU'
PY
if [ "$name" = lipsync ]; then
  python3 - "$tmp" <<'PY' || fail "lipsync's own uploads"
import json, re, sys, wave
tmp = sys.argv[1]
raw = open(f'{tmp}/raw.toml').read()
wav = re.search(r'kind = "melspec"\n(?:[^\[]*\n)*?path = "([^"]+)"', raw)
assert wav, 'no melspec path in raw.toml'
with wave.open(wav.group(1)) as w:
    samples = w.getnframes() * 16000 // w.getframerate()  # at 16 kHz, as melspec resamples
spec = 80 * (1 + samples // 200) * 4  # (80, frames) f32: hop 200 (spn_mel_frames)
lips = [s for s in json.load(open(f'{tmp}/gpu.rgb.json'))['stages'] if s['name'] == 'lips']
assert lips, 'no stage lips in the summary'
h2d = lips[0]['h2d']
assert h2d['copies'] == 1 and h2d['bytes'] == spec, \
    f"lipsync uploaded {h2d}, want the spectrogram once ({spec} bytes): the mel chunks must not go up"
print(f'lipsync: the spectrogram ({spec} bytes) went up once, nothing else')
PY
fi
"$spindle" run "$config" --devices cuda --set encode.path="$tmp/out.mp4" --set decode.duration="$duration" "${sets[@]}" \
  --log-format json >mp4.json 2>mp4.err || fail "$name.toml on cuda: exit $?: $(tail -3 mp4.err)"
[ -s out.mp4 ] || fail "no out.mp4"
# The whole job, its stages' own copies included (the encoder's YUV
# download, lipsync's spectrogram): at most one output frame's bytes between
# host and GPU per output frame (the issue's budget). Where the GPU has no
# NVDEC (the fake GPU of tests/gpu/host-emu) decode falls back to software
# and uploads each frame, one counted copy per frame that NVDEC saves: that
# upload must be counted, and the budget applies to the rest.
python3 - "$tmp" <<'PY' || fail "$name.toml on cuda: see above"
import json, sys, os
tmp = sys.argv[1]
cpu, gpu = json.load(open(f'{tmp}/cpu.rgb.json')), json.load(open(f'{tmp}/mp4.json'))
n = cpu['frames']
assert gpu['status'] == 'succeeded' and gpu['frames'] == n, f"the config on cuda: {gpu['status']}, {gpu['frames']} frames, want {n}"
frame = os.path.getsize(f'{tmp}/cpu.rgb') // n  # one output frame, RGB
t = gpu['transfers']
upload = 0
if 'decoding video in software and uploading each frame to the GPU' in open(f'{tmp}/mp4.err').read():
    dec = [s for s in gpu.get('stages', []) if s['name'] == 'decode']
    assert dec and dec[0].get('h2d', {}).get('copies') == n, f'software decode: not one counted upload per frame: {dec}'
    upload = dec[0]['h2d']['bytes']
    print(f'software decode (no NVDEC): {upload / n:.0f} bytes uploaded per frame, outside the budget')
pcie = (t['h2d']['bytes'] + t['d2h']['bytes'] - upload) / n
print(f'host<->GPU per output frame: {pcie:.0f} bytes = {pcie / frame:.3f} frames '
      f"(h2d {t['h2d']['bytes']}, d2h {t['d2h']['bytes']}, d2d {t['d2d']['bytes']})")
assert 0 < pcie <= frame, f'{pcie:.0f} bytes per frame crossed PCIe, the budget is one output frame ({frame} bytes)'
# Stream time (docs/gpu.md): every model stage, one instance on the GPU,
# has its calls timed on its stream: above zero, at most the job's time.
for s in gpu['stages']:
    print(f"stage {s['name']}: busy {s['busy_ms']:.1f} ms, stream {s.get('stream_ms', '-')} ms")
    if s['name'] in ('faces', 'lips', 'sr'):
        assert 0 < s.get('stream_ms', 0) <= gpu['elapsed_s'] * 1000 + 1, \
            f"stage {s['name']} on the GPU: stream time {s.get('stream_ms')} ms, job {gpu['elapsed_s']} s"
PY
echo "ok: $name"
