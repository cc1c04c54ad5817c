#!/usr/bin/env python3
"""Reference outputs for tests/media/test-image.c.

Writes, for each case, the input image(s) and the expected output as raw
little-endian arrays into the directory given on the command line:
  <case>.in.bin   input, HWC (u8 or f32) exactly as named in the case table
  <case>.ref.bin  expected output, same layout conventions
The expected values come from OpenCV (cv2.resize, cv2.cvtColor) or from the
formulas written out below in float64 NumPy (YUV, affine warp with exact
positions, float conversion, feathered paste), independently of the C code.
The case table here and the one in test-image.c must agree on names and sizes.
"""
import sys
import os
import numpy as np
import cv2


def image(h, w, c, seed, smooth=False):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([
        127 + 100 * np.sin(xx / 5.0 + k) * np.cos(yy / 7.0 - k) for k in range(c)
    ], axis=-1)
    if not smooth:
        base = base + rng.normal(0, 25, size=(h, w, c))
    return np.clip(np.rint(base), 0, 255).astype(np.uint8)


def save(d, name, kind, arr):
    np.ascontiguousarray(arr).tofile(os.path.join(d, f"{name}.{kind}.bin"))


def bilinear_exact(src, m_inv, dh, dw, border, value):
    """dst(x,y) = src(m_inv @ (x,y,1)) with exact bilinear taps; each tap
    outside the image takes `value` (constant) or is clamped (replicate)."""
    sh, sw, c = src.shape
    ys, xs = np.mgrid[0:dh, 0:dw].astype(np.float64)
    sx = m_inv[0, 0] * xs + m_inv[0, 1] * ys + m_inv[0, 2]
    sy = m_inv[1, 0] * xs + m_inv[1, 1] * ys + m_inv[1, 2]
    x0 = np.floor(sx)
    y0 = np.floor(sy)
    wx = (sx - x0)[..., None]
    wy = (sy - y0)[..., None]
    src = src.astype(np.float64)

    def tap(tx, ty):
        tx = tx.astype(np.int64)
        ty = ty.astype(np.int64)
        inside = (tx >= 0) & (ty >= 0) & (tx < sw) & (ty < sh)
        cx = np.clip(tx, 0, sw - 1)
        cy = np.clip(ty, 0, sh - 1)
        v = src[cy, cx]
        if border == "constant":
            v = np.where(inside[..., None], v, np.asarray(value, np.float64)[None, None, :])
        return v

    t00, t10 = tap(x0, y0), tap(x0 + 1, y0)
    t01, t11 = tap(x0, y0 + 1), tap(x0 + 1, y0 + 1)
    top = t00 + (t10 - t00) * wx
    bot = t01 + (t11 - t01) * wx
    return top + (bot - top) * wy


def round_u8(v):
    # round half away from zero, as the C code does (values are >= 0 here)
    return np.clip(np.floor(np.asarray(v) + 0.5), 0, 255).astype(np.uint8)


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)

    # --- resize, compared with OpenCV ---
    for name, (h, w), (dh, dw), interp, f32 in [
        ("resize_lin_down", (29, 37), (11, 16), cv2.INTER_LINEAR, False),
        ("resize_lin_up", (7, 13), (23, 40), cv2.INTER_LINEAR, False),
        ("resize_lin_f32", (29, 37), (20, 50), cv2.INTER_LINEAR, True),
        ("resize_area_int", (48, 64), (12, 16), cv2.INTER_AREA, False),
        ("resize_area_frac", (37, 50), (13, 17), cv2.INTER_AREA, False),
        ("resize_area_f32", (37, 50), (13, 17), cv2.INTER_AREA, True),
        ("resize_cub_up", (24, 31), (24, 41), cv2.INTER_CUBIC, False),
        ("resize_cub_down", (29, 37), (17, 20), cv2.INTER_CUBIC, False),
        ("resize_cub_f32", (29, 37), (20, 50), cv2.INTER_CUBIC, True),
    ]:
        src = image(h, w, 3, seed=sum(name.encode()))
        if f32:
            src = src.astype(np.float32) / 255.0
        save(d, name, "in", src)
        save(d, name, "ref", cv2.resize(src, (dw, dh), interpolation=interp))

    # --- RGB -> GRAY (OpenCV) ---
    src = image(21, 17, 3, seed=5)
    save(d, "gray", "in", src)
    save(d, "gray", "ref", cv2.cvtColor(src, cv2.COLOR_RGB2GRAY))

    # --- RGB -> YUV420P, BT.601 limited range, chroma = mean of the 2x2 block ---
    h, w = 9, 15
    src = image(h, w, 3, seed=6).astype(np.float64)
    r, g, b = src[..., 0], src[..., 1], src[..., 2]
    y = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255
    u = 128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255
    v = 128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255
    ch, cw = (h + 1) // 2, (w + 1) // 2
    uu = np.zeros((ch, cw))
    vv = np.zeros((ch, cw))
    for cy in range(ch):
        for cx in range(cw):
            uu[cy, cx] = u[2 * cy:2 * cy + 2, 2 * cx:2 * cx + 2].mean()
            vv[cy, cx] = v[2 * cy:2 * cy + 2, 2 * cx:2 * cx + 2].mean()
    save(d, "yuv", "in", src.astype(np.uint8))
    save(d, "yuv", "ref", np.concatenate([round_u8(y).ravel(), round_u8(uu).ravel(), round_u8(vv).ravel()]))
    # and back: YUV -> RGB with the inverse matrix, chroma interpolated
    # linearly at MPEG-2's siting: chroma column i sits on luma column 2i,
    # chroma row j midway between luma rows 2j and 2j+1 (edges repeated)
    yuv_y = round_u8(y).astype(np.float64)

    def up(p):
        def lerp_axis(a, pos):
            n = a.shape[0]
            pos = np.clip(pos, 0, n - 1)
            i0 = np.floor(pos).astype(int)
            i1 = np.minimum(i0 + 1, n - 1)
            f = (pos - i0).reshape((-1,) + (1,) * (a.ndim - 1))
            return a[i0] * (1 - f) + a[i1] * f
        rows = lerp_axis(p, (np.arange(h) - 0.5) / 2)
        return lerp_axis(rows.T, np.arange(w) / 2).T
    cb = up(round_u8(uu).astype(np.float64)) - 128
    cr = up(round_u8(vv).astype(np.float64)) - 128
    inv = np.linalg.inv(np.array([[65.481, 128.553, 24.966], [-37.797, -74.203, 112.0],
                                  [112.0, -93.786, -18.214]]) / 255)
    rgb = np.stack([yuv_y - 16, cb, cr], -1) @ inv.T
    save(d, "yuv_back", "ref", round_u8(rgb))

    # --- u8 RGB -> planar float BGR with mean/scale ---
    src = image(6, 11, 3, seed=7)
    mean = np.array([104.0, 117.0, 123.0])  # in destination (B,G,R) order
    scale = np.array([1 / 57.0, 1 / 57.5, 1 / 58.0])
    bgr = src[..., ::-1].astype(np.float64)
    save(d, "to_float", "in", src)
    save(d, "to_float", "ref", ((bgr - mean) * scale).transpose(2, 0, 1).astype(np.float32))

    # --- affine warp: exact bilinear reference, both borders ---
    src = image(30, 40, 3, seed=8)
    ang = np.deg2rad(17.0)
    m = np.array([[1.1 * np.cos(ang), -1.1 * np.sin(ang), 5.3],
                  [1.1 * np.sin(ang), 1.1 * np.cos(ang), -3.7]])
    m_inv = cv2.invertAffineTransform(m)
    save(d, "warp", "in", src)
    save(d, "warp_const", "ref", round_u8(bilinear_exact(src, m_inv, 32, 36, "constant", [10, 20, 30])))
    save(d, "warp_repl", "ref", round_u8(bilinear_exact(src, m_inv, 32, 36, "replicate", None)))
    # OpenCV itself on a smooth image (it quantises positions to 1/32 px)
    smooth = image(30, 40, 3, seed=9, smooth=True)
    save(d, "warp_cv", "in", smooth)
    save(d, "warp_cv", "ref", cv2.warpAffine(smooth, m, (36, 32), flags=cv2.INTER_LINEAR,
                                             borderMode=cv2.BORDER_REPLICATE))

    # --- feathered paste ---
    dst = image(20, 24, 3, seed=10)
    src = image(10, 12, 3, seed=11)
    fh, fw, feather = 10, 12, 3.0
    ay = np.clip(np.minimum(np.arange(fh) + 0.5, fh - np.arange(fh) - 0.5) / feather, 0, 1)
    ax = np.clip(np.minimum(np.arange(fw) + 0.5, fw - np.arange(fw) - 0.5) / feather, 0, 1)
    alpha = (ay[:, None] * ax[None, :])[..., None]
    out = dst.astype(np.float64).copy()
    ox, oy = 15, -3  # partly outside: right and top edges clip
    for sy in range(fh):
        for sx in range(fw):
            dy, dx = oy + sy, ox + sx
            if 0 <= dy < 20 and 0 <= dx < 24:
                a = alpha[sy, sx]
                out[dy, dx] = a * src[sy, sx] + (1 - a) * out[dy, dx]
    save(d, "paste", "in", np.concatenate([dst.ravel(), src.ravel()]))
    save(d, "paste", "ref", round_u8(out))


if __name__ == "__main__":
    main()
