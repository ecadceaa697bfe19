"""Portable exports of a student: ONNX (tf2onnx, run by onnxruntime) and TFLite (the TFLite
converter, builtin ops only, run by LiteRT), optionally quantized; and which format takes which
--quantize (`check_format`; a bfloat16 SavedModel only on a CPU with bfloat16 units: export.bfloat16).

Both portable formats hold the graph of the SavedModel's `ids` signature without tokenization
(export.serving.NerServing.portable_outputs): int32 input_ids, attention_mask [B, T] -> tag_ids,
tag_probs, probs for softmax students, the CRF potentials for CRF students. The directory
<export_dir>/<name>-<format>[-<quantize>]/ holds model.onnx or model.tflite, tokenizer.json (the
served vocabulary in Hugging Face `tokenizers` format; for a student of another tokenizer family, the teacher's
tokenizer.json and words.json, the served word split: `teacher_tokenizer`), export.json (tags, span tables, window
lengths, CRF transitions) and predict.py (export/portable.py), which gives the SavedModel's
entities with only numpy, tokenizers and the runtime.

- ONNX keeps T dynamic. Softmax BiLSTM students' graph is built from their weights (export.onnx_bilstm:
  one bidirectional LSTM op), checked against the Keras graph on probe windows (`convert_onnx`).
  Other students go through tf2onnx: the BiLSTM's fused kernel (BlockLSTMV2, no tf2onnx handler)
  becomes ONNX's LSTM op per direction (`_block_lstm_to_onnx`), and GELU's Erfc (none either) 1 - Erf.
- TFLite has no builtin for BlockLSTMV2 (only a Flex op), so the BiLSTM is unrolled
  (BlockBiLSTM(unroll=True)) at fixed window lengths, one signature `ids_<L>` per length
  (--xla_lengths; default the student's max_seq_length). A batch is padded to the shortest length
  that holds it; a text with more pieces than the longest length holds is cut into windows, as
  transformer students' are (docs/serving.md).
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from tokenizers import BertWordPieceTokenizer

from xtremedistil_tf.crf.decoding import DEFAULT_DECODE
from xtremedistil_tf import textfile
from xtremedistil_tf.data import shapes
from xtremedistil_tf.data.wordsplit import save_splitter
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.export import bfloat16, portable
from xtremedistil_tf.export.serving import STUDENT_IDENTITY, NerServing, export_student, tag_tables
from xtremedistil_tf.io import atomic_dir, atomic_write_json
from xtremedistil_tf.students.artifact import special_pieces, student_identity
from xtremedistil_tf.students.models import CASE_INPUT
from xtremedistil_tf.export import onnx_bilstm
from xtremedistil_tf.teachers.model import load_tokenizer

FORMATS = ("saved_model", "onnx", "tflite")
QUANTIZATIONS = ("none", "dynamic_int8", "float16", "bfloat16")
SUPPORTED = {
    "saved_model": ("none", "bfloat16"),
    "onnx": ("none", "dynamic_int8"),
    "tflite": ("none", "dynamic_int8", "float16"),
}
MODEL_FILES = {"onnx": "model.onnx", "tflite": "model.tflite"}
ONNX_OPSET = 17


def check_format(fmt: str, quantize: str, cpuinfo: str = "/proc/cpuinfo") -> None:
    """One-line ConfigError for an unknown format or quantization, a pair the format does not
    support, or bfloat16 on a CPU without bfloat16 units; checked before any work."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt}: expected one of {', '.join(FORMATS)}")
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"--quantize={quantize}: expected one of {', '.join(QUANTIZATIONS)}")
    if quantize not in SUPPORTED[fmt]:
        raise ConfigError(f"--format={fmt} does not support --quantize={quantize} (it supports "
                          f"{', '.join(SUPPORTED[fmt])})")
    if quantize == "bfloat16":
        bfloat16.check_cpu(cpuinfo)


def file_record(path) -> dict:
    """{"bytes", "sha256"} of a file as written: export.json's record of its model file (portable.check_model_file)."""
    return {"bytes": Path(path).stat().st_size, "sha256": portable.sha256_of(path)}


def portable_dir(export_dir, name: str, fmt: str, quantize: str) -> Path:
    """<export_dir>/<name>-<format>[-<quantize>]: outside <export_dir>/<name>, whose numeric
    versions TF Serving reads."""
    return Path(export_dir) / "-".join([name, fmt] + ([quantize] if quantize != "none" else []))


def write_tokenizer(vocab: List[str], lower_case: bool, path) -> None:
    """tokenizer.json: BERT WordPiece over `vocab` (ids = positions) with BERT's normalizer (lower
    case and accents stripped when `lower_case`, CJK characters split) and pre-tokenizer, as the
    SavedModel's tokenizer (export.words.WordPieces, tested on the same words)."""
    special = special_pieces(vocab)
    tokenizer = BertWordPieceTokenizer({piece: index for index, piece in enumerate(vocab)},
                                       **{f"{k}_token": special[k] for k in ("unk", "sep", "cls", "pad", "mask")},
                                       lowercase=lower_case, strip_accents=lower_case, clean_text=True,
                                       handle_chinese_chars=True)
    tokenizer.save(str(path))


def teacher_tokenizer(student_dir: Path, target: Path) -> dict:
    """A non-WordPiece student's tokenizer for predict.py, written to `target`: the teacher's tokenizer.json (from
    student_dir/tokenizer/) and words.json, the served word split (data/wordsplit.py), whose words predict.py
    encodes one by one as training did (data/alignment.word_pieces). Returns export.json's "words" and
    "special_ids" ({"cls", "sep", "pad", "unk"}: the tokenizer's own, e.g. RoBERTa's <s>=0, </s>=2, <pad>=1)."""
    tokenizer = load_tokenizer(str(student_dir / "tokenizer"))
    tokenizer.backend_tokenizer.save(str(target / "tokenizer.json"))
    save_splitter(target / "words.json")
    return {"words": "words.json",
            "special_ids": {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                            "pad": tokenizer.pad_token_id, "unk": tokenizer.unk_token_id}}


def _ids_function(module: NerServing, length: Optional[int]):
    """module.portable_outputs as a concrete function over [None, length] int32 inputs: input_ids, attention_mask,
    and case_ids for a student that reads word shapes."""
    spec = tf.TensorSpec([None, length], tf.int32)
    names = ("input_ids", "attention_mask") + ((CASE_INPUT,) if module.case else ())
    return tf.function(module.portable_outputs).get_concrete_function(
        *(tf.TensorSpec.from_spec(spec, name=name) for name in names))


# --- ONNX -------------------------------------------------------------------------------------

def _const_value(ctx, name: str) -> np.ndarray:
    node = ctx.get_node_by_output(name)
    if node is None or not node.is_const():
        raise ConfigError(f"ONNX export: {name} is not a constant after freezing; cannot build an ONNX LSTM")
    return node.get_tensor_value(as_list=False)


def _block_lstm_to_onnx(ctx, node, name, args):
    """tf2onnx handler: BlockLSTMV2 (time-major x, zero initial states, no peephole, no clip, as
    students.layers.BlockBiLSTM runs it over all T steps) -> ONNX LSTM (forward) on the same x.

    BlockLSTMV2's w is [D + H, 4H] with gates i, f, c, o (the Keras layout); ONNX wants
    W [1, 4H, D], R [1, 4H, H] with gates i, o, f, c and B [1, 8H] (input then recurrent bias)."""
    x, w_name, b_name = node.input[1], node.input[4], node.input[8]
    if node.get_attr_value("use_peephole") or node.get_attr_value("cell_clip", 0.0) > 0:
        raise ConfigError("ONNX export: BlockLSTMV2 with peepholes or a cell clip is not supported")
    w, b = _const_value(ctx, w_name), _const_value(ctx, b_name)
    hidden = b.shape[0] // 4
    order = np.concatenate([np.arange(hidden) + k * hidden for k in (0, 3, 1, 2)])  # i, f, c, o -> i, o, f, c
    dim = w.shape[0] - hidden
    weights = ctx.make_const(name + "_W", np.ascontiguousarray(w[:dim, order].T[None]).astype(np.float32))
    recurrent = ctx.make_const(name + "_R", np.ascontiguousarray(w[dim:, order].T[None]).astype(np.float32))
    bias = ctx.make_const(name + "_B", np.concatenate([b[order], np.zeros_like(b)])[None].astype(np.float32))
    lstm = ctx.make_node("LSTM", [x, weights.output[0], recurrent.output[0], bias.output[0]],
                         attr={"hidden_size": hidden, "direction": "forward"}, output_count=3,
                         name=name + "_onnx_lstm")
    axis = ctx.make_const(name + "_axis", np.array([1], np.int64))
    states = ctx.make_node("Squeeze", [lstm.output[0], axis.output[0]], name=name + "_states")
    ctx.replace_all_inputs(node.output[6], states.output[0])  # h [T, B, H]; the other outputs are unused
    ctx.remove_node(node.name)


def _erfc_to_onnx(ctx, node, name, args):
    """tf2onnx handler: Erfc(x) -> 1 - Erf(x) (GELU's exact form; ONNX has Erf only)."""
    erf = ctx.make_node("Erf", [node.input[0]], name=name + "_erf")
    one = ctx.make_const(name + "_one", np.array(1.0, np.float32))
    difference = ctx.make_node("Sub", [one.output[0], erf.output[0]], name=name + "_one_minus")
    ctx.replace_all_inputs(node.output[0], difference.output[0])
    ctx.remove_node(node.name)


def onnx_from_function(function, path: Path, low_memory: bool = False) -> None:
    """model.onnx at `path` from a concrete function over int32 [B, T] inputs, dynamic B and T, opset
    ONNX_OPSET, with this module's handlers (BlockLSTMV2, Erfc).

    `low_memory` (transformer teachers: export/teacher.py): tf2onnx's optimizers rewrite every node's
    protobuf after each pass, and the protobuf runtime keeps the old copy of a constant's bytes in
    the node's arena, so a plain conversion holds about 25 copies of the weights at its end (a
    MiniLM-sized teacher of 86 MiB peaked at 7.2 GB, a BERT-base-sized one past 16 GB). Here the
    frozen weights (constants over WEIGHT_BYTES) leave the TF graph as placeholders before
    conversion and come back as the ONNX model's initializers, so tf2onnx only handles the graph.
    Only for graphs whose handlers need no weight values (not the BiLSTM's BlockLSTMV2)."""
    import tf2onnx

    handlers = {"BlockLSTMV2": (_block_lstm_to_onnx, []), "Erfc": (_erfc_to_onnx, [])}
    if not low_memory:
        tf2onnx.convert.from_function(tf.function(function), input_signature=function.structured_input_signature[0],
                                      opset=ONNX_OPSET, custom_op_handlers=handlers, output_path=str(path))
        return
    import onnx
    from onnx import numpy_helper
    from tf2onnx import tf_loader
    from tf2onnx.convert import tensor_names_from_structed

    inputs = [t.name for t in function.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in function.outputs if t.dtype != tf.resource]
    renames = tensor_names_from_structed(function, inputs, outputs)
    graph, weights = _weights_as_placeholders(tf_loader.from_function(function, inputs, outputs))
    model, _ = tf2onnx.convert.from_graph_def(graph, input_names=inputs + list(weights), output_names=outputs,
                                              opset=ONNX_OPSET, custom_op_handlers=handlers,
                                              tensors_to_rename=renames)
    del graph
    kept = [tensor for tensor in model.graph.input if tensor.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name in list(weights):
        model.graph.initializer.append(numpy_helper.from_array(weights.pop(name), name))
    onnx.save(model, str(path))


WEIGHT_BYTES = 1 << 10  # onnx_from_function(low_memory=True): constants this large become initializers


def _weights_as_placeholders(graph_def):
    """(a copy of the frozen `graph_def` whose constants of over WEIGHT_BYTES are placeholders of
    their dtype and shape, {"<name>:0": value})."""
    weights = {}
    graph = tf.compat.v1.GraphDef()
    graph.versions.CopyFrom(graph_def.versions)
    graph.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is None or len(tensor.tensor_content) <= WEIGHT_BYTES:
            graph.node.add().CopyFrom(node)
            continue
        weights[node.name + ":0"] = tf.make_ndarray(tensor)
        placeholder = graph.node.add(name=node.name, op="Placeholder", device=node.device)
        placeholder.attr["dtype"].CopyFrom(node.attr["dtype"])
        placeholder.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
    return graph, weights


def quantize_onnx(source: Path, target: Path) -> None:
    """Dynamic int8: weights quantized by onnxruntime.quantization.quantize_dynamic (MatMul, Gather,
    LSTM, ...; activations at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)


# The most |probs| an ONNX graph built from the weights (onnx_bilstm) may differ from the Keras graph's on the probe
# windows: float32 rounding (ONNX Runtime's and TensorFlow's kernels sum in different orders).
PROBE_TOLERANCE = 1e-4


def convert_onnx(module: NerServing, path: Path, quantize: str) -> str:
    """model.onnx at `path`: the portable graph with dynamic B and T; with dynamic_int8 quantized
    (`quantize_onnx`). Softmax BiLSTM students get the graph built from their weights
    (export.onnx_bilstm: one bidirectional LSTM op, ~20 ops) once it matches the Keras graph on probe
    windows; other students, or one that does not match, the tf2onnx conversion. Returns which
    (export.json "onnx_graph"): "bilstm" or "tf2onnx (<why>)"."""
    target = path if quantize == "none" else path.with_suffix(".float32.onnx")
    model, why = onnx_bilstm.bilstm_graph(module, ONNX_OPSET)
    if model is not None:
        difference = onnx_bilstm.max_difference(module, model)
        if difference <= PROBE_TOLERANCE:
            import onnx

            onnx.save(model, str(target))
        else:
            model, why = None, f"the graph built from the weights differs from Keras by {difference:.2g}"
    if model is None:
        onnx_from_function(_ids_function(module, None), target)
    if quantize == "dynamic_int8":
        quantize_onnx(target, path)
        target.unlink()
    return "bilstm" if model is not None else f"tf2onnx ({why})"


# --- TFLite -----------------------------------------------------------------------------------

def tflite_lengths(module: NerServing, lengths: Sequence[int]) -> List[int]:
    """The fixed window lengths of a TFLite export: `lengths`, or the student's max_seq_length;
    transformer students always run at max_seq_length (their position embeddings)."""
    config = module.config
    if config.architecture == "transformer":
        if lengths and list(lengths) != [config.max_seq_length]:
            raise ConfigError(f"TFLite transformer students run at their max_seq_length "
                              f"({config.max_seq_length}); drop --xla_lengths")
        return [config.max_seq_length]
    lengths = sorted({int(n) for n in lengths}) or [config.max_seq_length]
    if lengths[0] < 3:
        raise ConfigError(f"--xla_lengths: TFLite window lengths must be >= 3 ([CLS], a piece, [SEP]); got {lengths}")
    return lengths


def convert_tflite(module: NerServing, path: Path, quantize: str, lengths: Sequence[int]) -> None:
    """model.tflite at `path` with one signature ids_<L> per length; builtin ops only (the converter
    fails on anything else). dynamic_int8: dynamic-range quantization (int8 weights); float16:
    float16 weights."""
    holder = tf.Module()
    holder.student_variables = module.student_variables
    signatures = {f"ids_{n}": _ids_function(module, n) for n in lengths}
    with tempfile.TemporaryDirectory(prefix="tflite_") as tmp:
        tf.saved_model.save(holder, tmp, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=list(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize in ("dynamic_int8", "float16"):
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
        path.write_bytes(converter.convert())


@dataclass
class Exported:
    """What an export wrote: its directory, the model file in it (the SavedModel dir itself for
    saved_model), and the module it was made from."""

    directory: Path
    model_file: Path
    module: NerServing


def export_portable(student_dir, export_dir, name: str = "ner", fmt: str = "onnx", quantize: str = "none",
                    overwrite: bool = False, prune_corpus: Sequence[Path] = (), min_count: int = 1,
                    keep_characters: bool = True, lengths: Sequence[int] = (),
                    decode: str = DEFAULT_DECODE) -> Exported:
    """Writes portable_dir(...) (see the module doc) for fmt "onnx" or "tflite"; `decode` as NerServing's."""
    check_format(fmt, quantize)
    if fmt == "saved_model":
        raise ConfigError("export_portable writes onnx and tflite; saved_model is serving.export_student")
    if fmt == "onnx" and lengths:
        raise ConfigError("--xla_lengths: ONNX exports keep the window length dynamic; drop it")
    target = portable_dir(export_dir, name, fmt, quantize)
    if target.exists() and not overwrite:
        raise ConfigError(f"{target} exists; pass --overwrite")
    module = NerServing.from_student_dir(student_dir, prune_corpus, min_count, keep_characters, unroll=fmt == "tflite",
                                         decode=decode, fmt=fmt)
    config = module.config
    window = config.max_seq_length if config.architecture == "transformer" else None
    fixed = tflite_lengths(module, lengths) if fmt == "tflite" else []
    if fixed:
        window = fixed[-1]
    words, prefixes, type_ids, types = tag_tables(config)
    crf = module._keras.crf if config.decoder == "crf" else None
    meta = {"format": fmt, "quantize": quantize, "model": MODEL_FILES[fmt], "decoder": config.decoder,
            "architecture": config.architecture, "lower_case": config.lower_case, "scheme": config.scheme,
            "tags": config.tags, "word_labels": words, "prefixes": prefixes, "type_ids": type_ids, "types": types,
            "pad_tag": config.tags.index("[PAD]"), "window": window, "lengths": fixed,
            "transitions": crf.transitions.numpy().tolist() if crf is not None else None,
            "parameters": module.served_parameters(), "versions": _versions(fmt), "case": module.case,
            **(module.word_decoder.export_meta() if module.word_decoder is not None else {"decode": module.decode})}
    with atomic_dir(target) as tmp:
        if fmt == "onnx":
            meta["onnx_graph"] = convert_onnx(module, tmp / MODEL_FILES[fmt], quantize)
        else:
            convert_tflite(module, tmp / MODEL_FILES[fmt], quantize, fixed)
        if module.vocab is not None:
            write_tokenizer(module.vocab, config.lower_case, tmp / "tokenizer.json")
            special = special_pieces(module.vocab)
            meta["special_ids"] = {k: module.vocab.index(special[k]) for k in ("cls", "sep", "pad", "unk")}
        else:
            meta.update(teacher_tokenizer(Path(student_dir), tmp))
        # What predict.py and bin/evaluate check before a runtime reads the file (a copy cut short or damaged).
        meta["model_file"] = file_record(tmp / MODEL_FILES[fmt])
        meta[STUDENT_IDENTITY] = student_identity(student_dir)   # the student it was made from
        atomic_write_json(tmp / "export.json", meta)
        shutil.copyfile(Path(__file__).with_name("portable.py"), tmp / "predict.py")
        shutil.copyfile(Path(textfile.__file__), tmp / "textfile.py")   # predict.py reads its input by it
        if module.case:   # predict.py reads word shapes by the training rule: the file itself
            shutil.copyfile(Path(shapes.__file__), tmp / "shapes.py")
    return Exported(target, target / MODEL_FILES[fmt], module)


def export(student_dir, export_dir, fmt: str = "saved_model", quantize: str = "none", name: str = "ner",
           version: int = 0, overwrite: bool = False, prune_corpus: Sequence[Path] = (), min_count: int = 1,
           keep_characters: bool = True, lengths: Sequence[int] = (), decode: str = DEFAULT_DECODE) -> Exported:
    """bin/export in any format: a SavedModel <export_dir>/<name>/<version>/ for TF Serving
    (serving.export_student; `lengths` are its --xla_lengths, `quantize` none or bfloat16), or a
    portable ONNX or TFLite dir (`export_portable`; `lengths`: TFLite's window lengths, no `version`)."""
    check_format(fmt, quantize)
    if fmt != "saved_model":
        if version:
            raise ConfigError(f"--version numbers SavedModels for TF Serving; --format={fmt} writes one directory")
        return export_portable(student_dir, export_dir, name, fmt, quantize, overwrite, prune_corpus, min_count,
                               keep_characters, lengths, decode)
    target, module = export_student(student_dir, export_dir, name, version, overwrite, prune_corpus, min_count,
                                    keep_characters, lengths, quantize == "bfloat16", decode)
    return Exported(target, target, module)


def _versions(fmt: str) -> Dict[str, str]:
    """The packages that made the export (export.json "versions")."""
    names = {"onnx": ("tensorflow", "tf2onnx", "onnx", "onnxruntime", "tokenizers"),
             "tflite": ("tensorflow", "ai-edge-litert", "tokenizers")}[fmt]
    found = {}
    for package in names:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found
