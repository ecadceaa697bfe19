"""The ONNX graph of a softmax BiLSTM student built from its weights (issue 33 item 3): what
`bin/export --format=onnx` writes for such students instead of the tf2onnx conversion.

Served form, for input_ids, attention_mask [B, T] int32 (and case_ids [B, T] of a student that reads word shapes):

    Gather(embedding, Transpose(input_ids)) [T, B, E]
      (Concat with Gather(case_embedding, Transpose(case_ids)) [T, B, C] for a student that reads word shapes)
      -> LSTM(direction="bidirectional", sequence_lens = the mask's nonzero count) [T, 2, B, H]
      -> Transpose + Reshape [B, T, 2H] -> MatMul + Add (+ GELU, in the pattern ONNX Runtime fuses)
      for each Dense -> Softmax = probs; ArgMax, ReduceMax, Where(attention_mask > 0) = tag_ids, tag_probs

about 20 ops where the tf2onnx graph runs about 60 (two forward LSTMs around ReverseSequence pairs,
Tensordot reshapes, GELU's erfc, tf.where as arithmetic): ONNX Runtime spends the saved ops'
dispatch at batch 1, where the BiLSTM's 32 steps are all the rest (docs/benchmarks.md). The same
numbers as the Keras model (students.layers.BlockBiLSTM: the backward direction runs over each
row's real positions reversed, which is what ONNX's bidirectional LSTM does with sequence_lens);
states at padded positions are zero here, so `probs` there differ (tags there are [PAD] in both).
Masks must be right-padded (predict.py's are), as BlockBiLSTM assumes.

`bilstm_graph` returns None, with the reason, for any other student (transformer or CRF students,
other layers or activations), which keep the tf2onnx conversion (export.formats).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.shapes import SHAPES
from xtremedistil_tf.students.layers import BlockBiLSTM, SequenceMask
from xtremedistil_tf.students.models import CASE_EMBEDDING, CASE_INPUT, reads_case

# Keras gates i, f, c, o -> ONNX i, o, f, c (blocks of H columns)
GATE_ORDER = (0, 3, 1, 2)
DENSE_ACTIVATIONS = ("linear", "gelu")
OUTPUTS = ("probs", "tag_ids", "tag_probs")  # the order tf2onnx gives portable_outputs


def _inbound(layer) -> list:
    nodes = layer._inbound_nodes
    if len(nodes) != 1:
        return []
    inbound = nodes[0].inbound_layers
    return list(inbound) if isinstance(inbound, (list, tuple)) else [inbound]


def _case_concat(layer, inbound) -> bool:
    """Whether `layer` (with its `inbound` layers) joins the word embedding of input_ids and the word-shape
    embedding of case_ids, in that order (students.models._embedded)."""
    return isinstance(layer, tf.keras.layers.Concatenate) and len(inbound) == 2 and \
        all(isinstance(i, tf.keras.layers.Embedding) for i in inbound) and inbound[1].name == CASE_EMBEDDING and \
        [[s.name for s in _inbound(i)] for i in inbound] == [["input_ids"], [CASE_INPUT]]


def served_chain(model: tf.keras.Model) -> Tuple[Optional[list], str]:
    """([Embedding, BlockBiLSTM, Dense..., softmax Activation], "") when the served Keras `model`
    is that chain (dropouts aside, the BiLSTM's mask a SequenceMask of attention_mask, the word-shape
    embedding of a student that reads them concatenated after the first Embedding's), else (None, why not)."""
    if list(model.output_names) != ["probs"]:
        return None, f"outputs {list(model.output_names)}, not softmax probs"
    chain, layer = [], model.get_layer("probs")
    while not isinstance(layer, tf.keras.layers.InputLayer):
        if layer.dtype != "float32" or (hasattr(layer, "compute_dtype") and layer.compute_dtype != "float32"):
            return None, f"layer {layer.name} computes in {layer.compute_dtype}"
        inbound = _inbound(layer)
        if isinstance(layer, BlockBiLSTM):
            if len(inbound) != 2 or not isinstance(inbound[1], SequenceMask) or \
                    [i.name for i in _inbound(inbound[1])] != ["attention_mask"]:
                return None, "the BiLSTM's mask is not attention_mask's"
            inbound = inbound[:1]
        elif isinstance(layer, tf.keras.layers.Dense):
            if layer.get_config()["activation"] not in DENSE_ACTIVATIONS:
                return None, f"Dense {layer.name} has activation {layer.get_config()['activation']}"
        elif isinstance(layer, tf.keras.layers.Activation):
            if chain or layer.get_config()["activation"] != "softmax":
                return None, f"activation layer {layer.name} is not the final softmax"
        elif _case_concat(layer, inbound):
            inbound = inbound[:1]
        elif not isinstance(layer, (tf.keras.layers.Embedding, tf.keras.layers.Dropout)):
            return None, f"layer {layer.name} ({type(layer).__name__}) has no ONNX form here"
        if len(inbound) != 1:
            return None, f"layer {layer.name} has {len(inbound)} inputs"
        if not isinstance(layer, (tf.keras.layers.Dropout, tf.keras.layers.Concatenate)):
            chain.append(layer)
        layer = inbound[0]
    chain.reverse()
    if layer.name != "input_ids":
        return None, f"the chain starts at {layer.name}, not input_ids"
    kinds = [type(c) for c in chain]
    if len(chain) < 4 or not issubclass(kinds[0], tf.keras.layers.Embedding) or \
            not isinstance(chain[1], BlockBiLSTM) or \
            not all(isinstance(c, tf.keras.layers.Dense) for c in chain[2:-1]):
        return None, "not Embedding -> BiLSTM -> Dense... -> softmax"
    return chain, ""


def _lstm_weights(layer) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX LSTM W [2, 4H, D], R [2, 4H, H], B [2, 8H] (forward, backward) from BlockBiLSTM's Keras
    kernels [2, D, 4H], [2, H, 4H] and bias [2, 1, 4H] (gates i, f, c, o)."""
    kernel, recurrent, bias = (w.numpy().astype(np.float32) for w in (layer.kernel, layer.recurrent_kernel, layer.bias))
    hidden = layer.units
    order = np.concatenate([np.arange(hidden) + k * hidden for k in GATE_ORDER])
    w = np.ascontiguousarray(kernel[:, :, order].transpose(0, 2, 1))
    r = np.ascontiguousarray(recurrent[:, :, order].transpose(0, 2, 1))
    b = np.concatenate([bias[:, 0, order], np.zeros_like(bias[:, 0])], axis=1)
    return w, r, b


def bilstm_graph(module, opset: int) -> Tuple[Optional["onnx.ModelProto"], str]:  # noqa: F821
    """(the ONNX model of `module`'s (export.serving.NerServing) portable outputs, "") for a softmax
    BiLSTM student whose served model is `served_chain`'s, else (None, why not)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    config = module.config
    if config.architecture != "bilstm" or config.decoder != "softmax":
        return None, f"{config.architecture} student with a {config.decoder} decoder"
    chain, reason = served_chain(module._keras.model)
    if chain is None:
        return None, reason
    embedding, bilstm, denses = chain[0], chain[1], chain[2:-1]
    weights = {"embedding": embedding.embeddings.numpy().astype(np.float32)}
    weights["lstm_W"], weights["lstm_R"], weights["lstm_B"] = _lstm_weights(bilstm)
    hidden = bilstm.units
    node = helper.make_node
    case = reads_case(module._keras.model)
    nodes: List = [
        node("Transpose", ["input_ids"], ["ids_time_major"], perm=[1, 0]),
        node("Gather", ["embedding", "ids_time_major"], ["word_embedded" if case else "embedded"]),  # [T, B, E]
    ]
    if case:
        weights["case_embedding"] = module._keras.model.get_layer(CASE_EMBEDDING).embeddings.numpy().astype(np.float32)
        nodes += [node("Transpose", [CASE_INPUT], ["case_time_major"], perm=[1, 0]),
                  node("Gather", ["case_embedding", "case_time_major"], ["case_embedded"]),  # [T, B, C]
                  node("Concat", ["word_embedded", "case_embedded"], ["embedded"], axis=-1)]  # [T, B, E + C]
    nodes += [
        node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),  # SequenceMask
        node("Cast", ["mask_bool"], ["mask_int"], to=TensorProto.INT32),
        node("ReduceSum", ["mask_int", "axis_1"], ["lengths"], keepdims=0),
        node("LSTM", ["embedded", "lstm_W", "lstm_R", "lstm_B", "lengths"], ["lstm_Y"], hidden_size=hidden,
             direction="bidirectional"),  # [T, 2, B, H]
        node("Transpose", ["lstm_Y"], ["lstm_batch_major"], perm=[2, 0, 1, 3]),  # [B, T, 2, H]
        node("Reshape", ["lstm_batch_major", "shape_BT2H"], ["states"]),  # [B, T, 2H]: forward then backward
    ]
    x = "states"
    for k, dense in enumerate(denses):
        weights[f"dense{k}_kernel"] = dense.kernel.numpy().astype(np.float32)
        nodes.append(node("MatMul", [x, f"dense{k}_kernel"], [f"dense{k}_matmul"]))
        x = f"dense{k}_matmul"
        if dense.use_bias:
            weights[f"dense{k}_bias"] = dense.bias.numpy().astype(np.float32)
            nodes.append(node("Add", [x, f"dense{k}_bias"], [f"dense{k}_biased"]))
            x = f"dense{k}_biased"
        if dense.get_config()["activation"] == "gelu":  # 0.5 x (1 + erf(x / sqrt 2)), exact GELU
            nodes += [node("Div", [x, "sqrt2"], [f"gelu{k}_scaled"]), node("Erf", [f"gelu{k}_scaled"], [f"gelu{k}_erf"]),
                      node("Add", [f"gelu{k}_erf", "one"], [f"gelu{k}_1p"]),
                      node("Mul", [x, f"gelu{k}_1p"], [f"gelu{k}_x1p"]),
                      node("Mul", [f"gelu{k}_x1p", "half"], [f"gelu{k}"])]
            x = f"gelu{k}"
    nodes += [
        node("Softmax", [x], ["probs"], axis=-1),
        node("ArgMax", ["probs"], ["argmax"], axis=-1, keepdims=0),
        node("Cast", ["argmax"], ["argmax_int"], to=TensorProto.INT32),
        node("ReduceMax", ["probs"], ["max_prob"], axes=[-1], keepdims=0),
        node("Greater", ["attention_mask", "zero_int"], ["real"]),
        node("Where", ["real", "argmax_int", "pad_tag"], ["tag_ids"]),
        node("Where", ["real", "max_prob", "zero_float"], ["tag_probs"]),
    ]
    constants = {"axis_1": np.array([1], np.int64), "shape_BT2H": np.array([0, 0, 2 * hidden], np.int64),
                 "sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
                 "half": np.array(0.5, np.float32), "zero_int": np.array(0, np.int32),
                 "pad_tag": np.array(module._pad_tag, np.int32), "zero_float": np.array(0.0, np.float32)}
    initializers = [numpy_helper.from_array(value, name) for name, value in {**weights, **constants}.items()]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", "length"])
              for name in ("input_ids", "attention_mask") + ((CASE_INPUT,) if case else ())]
    tags = int(chain[-2].units)
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", "length", tags]),
               helper.make_tensor_value_info("tag_ids", TensorProto.INT32, ["batch", "length"]),
               helper.make_tensor_value_info("tag_probs", TensorProto.FLOAT, ["batch", "length"])]
    graph = helper.make_graph(nodes, "bilstm_student", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="xtremedistil_tf.export.onnx_bilstm")
    onnx.checker.check_model(model)
    return model, ""


def probe_ids(vocab_size: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded probe windows [8, 24] of random pieces, lengths 1 to 24 (one full row): ids, mask, and random
    word shapes (data/shapes.py) of the pieces."""
    rng = np.random.default_rng(seed)
    lengths = np.array([24, 1, 2, 7, 13, 24, 18, 5])
    mask = (np.arange(24)[None, :] < lengths[:, None]).astype(np.int32)
    shapes = rng.integers(1, len(SHAPES), mask.shape) * mask
    return (rng.integers(0, vocab_size, mask.shape) * mask).astype(np.int32), mask, shapes.astype(np.int32)


def max_difference(module, model) -> float:
    """The largest |probs| difference, at real positions of `probe_ids`, between `model` (run by
    ONNX Runtime) and the Keras graph (module.portable_outputs); tags are checked equal where the
    Keras probabilities' top two differ by more than 1e-4 (a tie may go either way)."""
    import onnxruntime

    ids, mask, shapes = probe_ids(int(served_chain(module._keras.model)[0][0].input_dim))
    inputs = {"input_ids": ids, "attention_mask": mask, **({CASE_INPUT: shapes} if module.case else {})}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    expected = {k: v.numpy() for k, v in module.portable_outputs(*map(tf.constant, inputs.values())).items()}
    real = mask.astype(bool)
    top2 = np.sort(expected["probs"], axis=-1)[..., -2:]
    clear = real & (top2[..., 1] - top2[..., 0] > 1e-4)
    if not np.array_equal(got["tag_ids"][clear], expected["tag_ids"][clear]) or \
            not np.array_equal(got["tag_ids"][~real], expected["tag_ids"][~real]):
        return float("inf")
    return float(np.abs(got["probs"][real] - expected["probs"][real]).max())
