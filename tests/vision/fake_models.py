"""Tiny ONNX stand-ins for the vision stage tests, run by the real engine.

sr_x2(path): a 3x3 box blur (zero padding) of each channel, upsampled x2
nearest — one Conv 3->12 (each output channel the box filter of one input
channel) and DepthToSpace(2, DCR). A local operator of radius 1, enough to
see tiling seams; H and W are dynamic so every tile size runs.

retinaface(path, w, h): RetinaFace's three outputs (loc, conf, landms) for a
(1,3,h,w) input: loc zero (boxes = priors), every face score 0.01 except the
anchor of stride 32, row 2, col 3, min_size 256 (score 0.99) and its right
neighbour (0.9, suppressed by NMS: IoU 0.78). The landmarks of that anchor
carry the per-channel means of the input in their first three values (the
rest zero), so a test can check the preprocessing from the decoded face.
With batch=True the first axis of the input and outputs is dynamic (N, as
the real export has it) and each image's landmarks carry its own means.

Both need the onnx package; callers skip (exit 77) without it.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


def _save(graph, path):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid('', OPSET)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, path)


def sr_x2(path):
    w = np.zeros((12, 3, 3, 3), np.float32)
    for k in range(12):
        w[k, k % 3] = 1.0 / 9.0
    g = helper.make_graph(
        [helper.make_node('Conv', ['input', 'w'], ['c'], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node('DepthToSpace', ['c'], ['output'], blocksize=2, mode='DCR')],
        'fake_sr_x2',
        [helper.make_tensor_value_info('input', TensorProto.FLOAT, [1, 3, 'h', 'w'])],
        [helper.make_tensor_value_info('output', TensorProto.FLOAT, [1, 3, 'h2', 'w2'])],
        [numpy_helper.from_array(w, 'w')])
    _save(g, path)


def retinaface_anchors(w, h):
    """(number of anchors, index of the confident one)."""
    n, target = 0, -1
    for k, step in enumerate((8, 16, 32)):
        fh, fw = (h + step - 1) // step, (w + step - 1) // step
        if k == 2:
            target = n + (2 * fw + 3) * 2
        n += fh * fw * 2
    return n, target


def retinaface(path, w, h, batch=False):
    n, target = retinaface_anchors(w, h)
    b = -1 if batch else 1
    conf = np.zeros((1, n, 2), np.float32)
    conf[0, :, 0], conf[0, :, 1] = 0.99, 0.01
    conf[0, target, 1] = 0.99
    conf[0, target + 2, 1] = 0.9
    mask = np.zeros((1, n, 1), np.float32)
    mask[0, target, 0] = 1
    pick = np.zeros((3, 10), np.float32)
    pick[0, 0] = pick[1, 1] = pick[2, 2] = 1
    inits = [numpy_helper.from_array(a, name) for a, name in [
        (conf, 'conf_c'), (mask, 'mask'), (np.ones((1, n, 1), np.float32), 'ones'), (pick, 'pick'),
        (np.zeros((3, 4), np.float32), 'z4'), (np.zeros((3, 2), np.float32), 'z2'),
        (np.array([b, 3], np.int64), 's13'), (np.array([b, 1, 10], np.int64), 's10'),
        (np.array([b, 1, 4], np.int64), 's4'), (np.array([b, 1, 2], np.int64), 's2')]]
    nodes = [
        helper.make_node('GlobalAveragePool', ['input'], ['gap']),
        helper.make_node('Reshape', ['gap', 's13'], ['means']),
        helper.make_node('MatMul', ['means', 'pick'], ['lm_row']),
        helper.make_node('Reshape', ['lm_row', 's10'], ['lm_row3']),
        helper.make_node('Mul', ['lm_row3', 'mask'], ['landms']),
        helper.make_node('MatMul', ['means', 'z4'], ['zero4']),
        helper.make_node('Reshape', ['zero4', 's4'], ['zero4r']),
        helper.make_node('Mul', ['zero4r', 'ones'], ['loc']),
        helper.make_node('MatMul', ['means', 'z2'], ['zero2']),
        helper.make_node('Reshape', ['zero2', 's2'], ['zero2r']),
        helper.make_node('Add', ['conf_c', 'zero2r'], ['conf']),
    ]
    N = 'N' if batch else 1
    g = helper.make_graph(
        nodes, 'fake_retinaface',
        [helper.make_tensor_value_info('input', TensorProto.FLOAT, [N, 3, h, w])],
        [helper.make_tensor_value_info('loc', TensorProto.FLOAT, [N, n, 4]),
         helper.make_tensor_value_info('conf', TensorProto.FLOAT, [N, n, 2]),
         helper.make_tensor_value_info('landms', TensorProto.FLOAT, [N, n, 10])],
        inits)
    _save(g, path)
