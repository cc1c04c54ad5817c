#!/usr/bin/env python3
"""Export a public checkpoint to ONNX in the form Spindle's stages expect.

  export.py wav2lip      wav2lip_gan.pth          wav2lip.onnx
  export.py retinaface   mobilenet0.25_Final.pth  retinaface_mnet025.onnx
  export.py rrdbnet      RealESRGAN_x4plus.pth    realesrgan_x4plus.onnx
  export.py srvgg        realesr-general-x4v3.pth realesr_general_x4v3.onnx

All exports use opset 17, float32, a dynamic batch dimension named N (and
dynamic H, W for RetinaFace and the super-resolution nets), fixed channel
order (see each network's docstring in archs.py); BatchNorm is folded by the
exporter or, if left in, by Spindle's loader. Check the result with `spindle model inspect`.
Requires torch (CPU is enough); not run in CI.
"""
import argparse
import sys

import torch

import archs


def load_state(path):
    ck = torch.load(path, map_location="cpu")
    for key in ("params_ema", "params", "state_dict", "model"):
        if isinstance(ck, dict) and key in ck:
            ck = ck[key]
            break
    return {k[7:] if k.startswith("module.") else k: v for k, v in ck.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("net", choices=["wav2lip", "retinaface", "rrdbnet", "srvgg"])
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--nconv", type=int, default=32, help="SRVGGNetCompact conv count (32 for x4v3, 16 for animevideov3)")
    a = ap.parse_args()
    if a.net == "wav2lip":
        net = archs.Wav2Lip()
        args = (torch.rand(1, 1, 80, 16), torch.rand(1, 6, 96, 96))
        names, outs = ["mel", "face"], ["output"]
        dyn = {"mel": {0: "N"}, "face": {0: "N"}, "output": {0: "N"}}
    elif a.net == "retinaface":
        net = archs.RetinaFace()
        args = (torch.rand(1, 3, 640, 640),)
        names, outs = ["input"], ["bbox", "conf", "landmarks"]
        dyn = {"input": {0: "N", 2: "H", 3: "W"}, "bbox": {0: "N", 1: "P"}, "conf": {0: "N", 1: "P"}, "landmarks": {0: "N", 1: "P"}}
    elif a.net == "rrdbnet":
        net = archs.RRDBNet()
        args = (torch.rand(1, 3, 64, 64),)
        names, outs = ["input"], ["output"]
        dyn = {"input": {0: "N", 2: "H", 3: "W"}, "output": {0: "N", 2: "H4", 3: "W4"}}
    else:
        net = archs.SRVGGNetCompact(nconv=a.nconv)
        args = (torch.rand(1, 3, 64, 64),)
        names, outs = ["input"], ["output"]
        dyn = {"input": {0: "N", 2: "H", 3: "W"}, "output": {0: "N", 2: "H4", 3: "W4"}}
    missing, unexpected = net.load_state_dict(load_state(a.checkpoint), strict=False)
    if missing or unexpected:
        print(f"state dict mismatch: missing {missing[:5]}..., unexpected {unexpected[:5]}...", file=sys.stderr)
        return 1
    net.eval()
    torch.onnx.export(net, args, a.out, opset_version=17, input_names=names, output_names=outs,
                      dynamic_axes=dyn, do_constant_folding=True, training=torch.onnx.TrainingMode.EVAL)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
