"""CPU latency lookup table of the search space (KD-NAS section 4.1, footnote 7).

The paper times every one of its 2400 randomly initialised students at batch 1 over 10k
sentences and 3 runs: hours of CPU. Here a student's latency is modelled as

    lat(arch) = overhead(hidden) + layers * (attention(heads, hidden) + ffn(hidden, intermediate, activation))

since a BERT block is its self-attention sub-block (Q/K/V, softmax, output dense, LayerNorm)
followed by its feed-forward sub-block (dense, activation, dense, LayerNorm), and they share
nothing but the hidden size. Table 1's space then needs 20 attention and 96 FFN timings instead
of 2400 models (or 480 whole blocks). Each sub-block is timed as `reps` stacked copies with
distinct weights inside one tf.function, so the per-call overhead is counted once, as in a full
model, and no copy finds another's weights in cache; the cost of the call itself (an identity
function timed the same way) is subtracted; overhead(hidden) is a 1-layer TFBertModel's
latency minus its block (embeddings, pooler, masks, the call). The model is checked against full
models (`verify`); the error is stored in the table and reported.

Every timing: batch 1, inputs of the given sentence lengths (in word pieces), two warm-up calls
per length, then the fastest of `runs` calls per length (process CPU time, caches flushed before
each call), averaged over lengths; milliseconds. Run with one intra-op thread (bin/nas_search
--num_threads=1, the default), this is single-core latency, which stays stable on a shared machine.
The table is a JSON file written atomically every few entries, so an interrupted build resumes.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf
from tqdm import tqdm
from transformers import BertConfig, TFBertModel
from transformers.models.bert.modeling_tf_bert import TFBertAttention, TFBertIntermediate, TFBertOutput

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, read_json
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace

TABLE_VERSION = 4


def attention_key(heads: int, hidden: int) -> str:
    return f"{heads},{hidden}"


def ffn_key(hidden: int, intermediate: int, activation: str) -> str:
    return f"{hidden},{intermediate},{activation}"


_FLUSH = None


def _flush_cache() -> None:
    """Touch 64 MiB so no call finds the previous call's weights in the CPU caches: a block timed on
    its own would otherwise stay cached between calls, which it does not inside a whole model."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = np.zeros(16 * 1024 * 1024, np.float32)
    np.add(_FLUSH, 1.0, out=_FLUSH)


def time_calls(fn: Callable[[int], object], lengths: Sequence[int], runs: int) -> float:
    """Mean over `lengths` of the fastest of `runs` timed calls fn(length), after two warm-ups; ms.

    Time is the process's CPU time (time.process_time): with one intra-op thread it is the call's
    latency on an idle core, and unlike wall-clock time it does not grow when other processes share
    the cores. The fastest run counts, as interference only ever adds time. The caches are flushed
    before every timed call.
    """
    per_length = []
    for length in lengths:
        fn(length)  # the first calls at a new shape are slower (grappler, allocator): not timed
        fn(length)
        samples = []
        for _ in range(runs):
            _flush_cache()
            start = time.process_time()
            fn(length)
            samples.append(time.process_time() - start)
        per_length.append(float(np.min(samples)))
    return 1000.0 * float(np.mean(per_length))


def _bert_config(base: dict, **fields):
    return BertConfig(**{**base, **fields})


def model_latency(config_fields: dict, lengths: Sequence[int], runs: int) -> float:
    """Latency (ms) of a randomly initialised TFBertModel with `config_fields` at batch 1."""
    model = TFBertModel(_bert_config(config_fields))
    vocab = int(model.config.vocab_size)

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([1, None], tf.int32)])
    def forward(ids, mask):
        return model(input_ids=ids, attention_mask=mask, training=False).last_hidden_state

    rng = np.random.default_rng(0)

    def call(length: int):
        ids = tf.constant(rng.integers(1, vocab, size=(1, length)), tf.int32)
        return forward(ids, tf.ones_like(ids)).numpy()

    return time_calls(call, lengths, runs)


def _stack_latency(make_part, apply_part, hidden: int, lengths: Sequence[int], runs: int, reps: int) -> float:
    parts = [make_part(n) for n in range(reps)]

    @tf.function(input_signature=[tf.TensorSpec([1, None, hidden], tf.float32)])
    def forward(x):
        additive_mask = tf.zeros([1, 1, 1, tf.shape(x)[1]])
        for part in parts:
            x = apply_part(part, x, additive_mask)
        return x

    @tf.function(input_signature=[tf.TensorSpec([1, None, hidden], tf.float32)])
    def identity(x):
        return x + 0.0

    rng = np.random.default_rng(0)

    def timer(fn):
        return lambda length: fn(tf.constant(rng.standard_normal((1, length, hidden)), tf.float32)).numpy()

    # The call itself (making the input, dispatch, reading the output back) costs about 1 ms of CPU
    # time; a whole model pays it once, so it is measured with an identity function and removed.
    return max(0.0, time_calls(timer(forward), lengths, runs) - time_calls(timer(identity), lengths, runs)) / reps


def attention_latency(base: dict, heads: int, hidden: int, lengths: Sequence[int], runs: int, reps: int = 2) -> float:
    """Latency (ms) of one self-attention sub-block (TFBertAttention: Q/K/V, softmax, output, LayerNorm)."""
    config = _bert_config(base, num_attention_heads=heads, hidden_size=hidden)
    return _stack_latency(lambda n: TFBertAttention(config, name=f"attention_{n}"),
                          lambda part, x, mask: part(x, mask, None, None, None, None, False, training=False)[0],
                          hidden, lengths, runs, reps)


def ffn_latency(base: dict, hidden: int, intermediate: int, activation: str, lengths: Sequence[int], runs: int,
                reps: int = 2) -> float:
    """Latency (ms) of one feed-forward sub-block (dense, activation, dense, residual LayerNorm)."""
    config = _bert_config(base, hidden_size=hidden, intermediate_size=intermediate, hidden_act=activation)
    return _stack_latency(lambda n: (TFBertIntermediate(config, name=f"intermediate_{n}"),
                                     TFBertOutput(config, name=f"output_{n}")),
                          lambda part, x, mask: part[1](part[0](x), x, training=False),
                          hidden, lengths, runs, reps)


class LatencyTable:
    """Lookup of modelled student latencies (ms); see the module docstring for the model."""

    def __init__(self, data: dict):
        self.data = data

    @property
    def teacher_ms(self) -> float:
        return float(self.data["teacher_ms"])

    def block_ms(self, arch: Arch) -> float:
        """attention(heads, hidden) + ffn(hidden, intermediate, activation)."""
        keys = (("attention", attention_key(arch.heads, arch.hidden)),
                ("ffn", ffn_key(arch.hidden, arch.intermediate, arch.activation)))
        for part, key in keys:
            if key not in self.data[part]:
                raise ConfigError(f"latency table has no {part} sub-block {key} (architecture {arch.key}); "
                                  "rebuild it over this space")
        return sum(float(self.data[part][key]) for part, key in keys)

    def overhead_ms(self, hidden: int) -> float:
        if str(hidden) not in self.data["overhead"]:
            raise ConfigError(f"latency table has no overhead for hidden size {hidden}; rebuild it over this space")
        return float(self.data["overhead"][str(hidden)])

    def latency(self, arch: Arch) -> float:
        return self.overhead_ms(arch.hidden) + arch.layers * self.block_ms(arch)

    @property
    def verification(self) -> List[dict]:
        return list(self.data.get("verification", []))

    def verification_error(self) -> Optional[float]:
        """Mean absolute relative error of the additive model on the verified full models."""
        rows = self.verification
        if not rows:
            return None
        return float(np.mean([abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rows]))

    @classmethod
    def load(cls, path) -> "LatencyTable":
        data = read_json(path)
        if data.get("version") != TABLE_VERSION or not data.get("complete"):
            raise ConfigError(f"{path}: not a complete latency table (version {TABLE_VERSION}); rebuild it")
        return cls(data)


def _settings(base: dict, space: SearchSpace, lengths: Sequence[int], runs: int, reps: int) -> dict:
    """What the timings depend on; a cached table is only reused when these match."""
    return {"base_config": {k: base[k] for k in sorted(base) if k in ("vocab_size", "max_position_embeddings",
                                                                        "type_vocab_size")},
            "space": space.to_dict(), "lengths": [int(n) for n in lengths], "runs": int(runs), "reps": int(reps),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "tensorflow": tf.__version__}


def _sub_blocks(space: SearchSpace) -> tuple:
    attention = sorted({(a.heads, a.hidden) for a in space.states})
    ffn = sorted({(a.hidden, a.intermediate, a.activation) for a in space.states})
    return attention, ffn


def build_latency_table(path, space: SearchSpace, teacher_config: dict, lengths: Sequence[int], runs: int = 3,
                        reps: int = 2, verify: Sequence[Arch] = (), progress: bool = True,
                        save_every: int = 10) -> LatencyTable:
    """Time every sub-block of `space`, the overheads, the teacher and the `verify` full models into `path`.

    teacher_config: the teacher's config.json fields (vocab and position sizes are kept for
    students). An existing file with the same settings is resumed (its entries are kept); one
    with other settings is an error, so a table is never silently mixed.
    """
    path = Path(path)
    base = {k: teacher_config[k] for k in ("vocab_size", "max_position_embeddings", "type_vocab_size")
            if k in teacher_config}
    settings = _settings(base, space, lengths, runs, reps)
    data = {"version": TABLE_VERSION, "settings": settings, "attention": {}, "ffn": {}, "overhead": {},
            "verification": [], "complete": False}
    if path.exists():
        old = read_json(path)
        # A finished table is a lookup: a process with other thread settings may read it. Resuming
        # an unfinished one must time with the same threads.
        ignored = () if not old.get("complete") else ("intra_op_threads",)
        same = {k: v for k, v in (old.get("settings") or {}).items() if k not in ignored} == \
            {k: v for k, v in settings.items() if k not in ignored}
        if old.get("version") != TABLE_VERSION or not same:
            raise ConfigError(f"{path} was built with other settings (space, lengths, runs or threads); "
                              "delete it or pass another --latency_table")
        if old.get("complete"):
            return LatencyTable(old)
        data = old
    attention, ffn = _sub_blocks(space)
    jobs = [("attention", attention_key(*k), lambda k=k: attention_latency(base, *k, lengths, runs, reps))
            for k in attention]
    jobs += [("ffn", ffn_key(*k), lambda k=k: ffn_latency(base, *k, lengths, runs, reps)) for k in ffn]
    jobs = [j for j in jobs if j[1] not in data[j[0]]]
    hiddens = [h for h in space.hidden if str(h) not in data["overhead"] and any(a.hidden == h for a in space.states)]
    teacher_todo = 0 if "teacher_ms" in data else 1
    verify_todo = [a for a in verify if a.key not in {r["arch"] for r in data["verification"]}]
    bar = tqdm(total=len(jobs) + len(hiddens) + teacher_todo + len(verify_todo), desc="latency table",
               disable=not progress)
    for n, (part, key, measure) in enumerate(jobs, start=1):
        data[part][key] = measure()
        bar.update()
        if n % save_every == 0:
            atomic_write_json(path, data)
    table = LatencyTable(data)
    for hidden in hiddens:
        arch = next(a for a in space.states if a.hidden == hidden)
        full = model_latency(Arch(1, arch.heads, hidden, arch.intermediate, arch.activation).bert_config(base),
                             lengths, runs)
        data["overhead"][str(hidden)] = full - table.block_ms(arch)
        bar.update()
        atomic_write_json(path, data)
    if teacher_todo:
        data["teacher_ms"] = model_latency({**teacher_config}, lengths, runs)
        bar.update()
        atomic_write_json(path, data)
    for arch in verify_todo:
        data["verification"].append({"arch": arch.key, "predicted_ms": table.latency(arch),
                                     "measured_ms": model_latency(arch.bert_config(base), lengths, runs)})
        bar.update()
        atomic_write_json(path, data)
    bar.close()
    data["complete"] = True
    atomic_write_json(path, data)
    return LatencyTable(data)
