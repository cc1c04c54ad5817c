#!/usr/bin/env python3
"""Write N damaged copies of an MP4 clip, and a manifest, for the bad-media
tests (tests/jobs/test-media-jobs.py, case corrupt; tools: the 1,000-clip
run in docs/media.md).

  make-corrupt-clips.py SOURCE.mp4 OUT_DIR N [--seed S]

Kinds, in turn (deterministic for a seed):
  trunc     the first 1-99 % of the file (a partial download)
  bitflip   1-64 random bits flipped in the media data (mdat)
  box       one box header of the index (moov and below) damaged: its size
            zeroed, made huge, made tiny, or its type overwritten
  zero      an empty file
  garbage   random bytes with an MP4 name
  novideo   the audio alone (ffmpeg -vn -c copy): no video stream
  noaudio   the video alone (ffmpeg -an -c copy): valid, must succeed
  intact    an unchanged copy: must succeed
OUT_DIR/manifest.json lists {file, kind, detail, frames (the source's video
frame count), has_audio}. Every clip is small (the source's size or less).
"""
import json
import os
import random
import struct
import subprocess
import sys

KINDS = ["trunc", "bitflip", "box", "trunc", "bitflip", "box", "zero", "garbage", "novideo", "noaudio", "intact"]


def boxes(data, start, end, depth=0):
    """(offset, size, type) of every box header under [start, end), walking
    the containers that hold other boxes."""
    out = []
    i = start
    while i + 8 <= end:
        size, typ = struct.unpack(">I4s", data[i:i + 8])
        if size < 8 or i + size > end:
            break
        out.append((i, size, typ))
        if typ in (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"udta", b"dinf") and depth < 8:
            out += boxes(data, i + 8, i + size, depth + 1)
        elif typ == b"stsd" and depth < 8:
            out += boxes(data, i + 16, i + size, depth + 1)
        i += size
    return out


def main():
    args = sys.argv[1:]
    seed = 1
    if "--seed" in args:
        k = args.index("--seed")
        seed = int(args[k + 1])
        del args[k:k + 2]
    src, out, n = args[0], args[1], int(args[2])
    rng = random.Random(seed)
    data = open(src, "rb").read()
    os.makedirs(out, exist_ok=True)
    probe = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v", "-count_packets", "-show_entries",
                            "stream=nb_read_packets", "-of", "csv=p=0", src], capture_output=True, text=True)
    frames = int(probe.stdout.strip())
    all_boxes = boxes(data, 0, len(data))
    index = [b for b in all_boxes if b[2] != b"mdat" and b[2] != b"free" and b[2] != b"ftyp"]
    mdat = [b for b in all_boxes if b[2] == b"mdat"][0]
    derived = {}
    for kind, args_ in (("novideo", ["-vn"]), ("noaudio", ["-an"])):
        path = os.path.join(out, f"_{kind}.mp4")
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", src, *args_, "-c", "copy", path], check=True)
        derived[kind] = open(path, "rb").read()
        os.unlink(path)
    manifest = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        has_audio = True
        detail = ""
        if kind == "trunc":
            cut = rng.randint(1, 99) * len(data) // 100
            clip, detail = data[:cut], f"first {cut} of {len(data)} bytes"
        elif kind == "bitflip":
            b = bytearray(data)
            nbits = rng.choice([1, 2, 4, 8, 16, 64])
            for _ in range(nbits):
                pos = rng.randrange(mdat[0] + 8, mdat[0] + mdat[1])
                b[pos] ^= 1 << rng.randrange(8)
            clip, detail = bytes(b), f"{nbits} bits in mdat"
        elif kind == "box":
            b = bytearray(data)
            off, size, typ = rng.choice(index)
            how = rng.choice(["zero-size", "huge-size", "tiny-size", "type"])
            if how == "zero-size":
                b[off:off + 4] = struct.pack(">I", 0)
            elif how == "huge-size":
                b[off:off + 4] = struct.pack(">I", 0x7FFFFFF0)
            elif how == "tiny-size":
                b[off:off + 4] = struct.pack(">I", rng.randint(1, 7))
            else:
                b[off + 4:off + 8] = bytes(rng.randrange(97, 123) for _ in range(4))
            clip, detail = bytes(b), f"{typ.decode(errors='replace')} at {off}: {how}"
        elif kind == "zero":
            clip = b""
        elif kind == "garbage":
            clip = bytes(rng.randrange(256) for _ in range(rng.randint(16, 20000)))
        elif kind in derived:
            clip = derived[kind]
            has_audio = kind == "novideo"
        else:
            clip = data
        name = f"c{i:04d}-{kind}.mp4"
        with open(os.path.join(out, name), "wb") as f:
            f.write(clip)
        manifest.append({"file": name, "kind": kind, "detail": detail, "frames": frames, "has_audio": has_audio})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
