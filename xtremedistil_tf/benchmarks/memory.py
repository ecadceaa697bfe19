"""`bin/benchmark memory`: peak RSS of student training over cached transfer sets of 10k and 100k windows.

Issue 9, item 6: the peak memory of student training must not grow with the transfer-set size.

The cache: synthetic teacher outputs in the layout `transfer/multigrained.py` writes for
WikiAnn (T=64 pieces, N=11 piece tags, MiniLM's H=384 hidden states stored as float16, K=5 k-best
paths), random values, written with `transfer.cache.write_sharded` in 1,000-window shards. The
first 2,000 windows are labeled, the rest carry [PAD] tags (unlabeled transfer sentences), as in
the pipeline's transfer cache. Full size, nothing reduced: 100k windows are 5.2 GiB on disk (the
caches are deleted afterwards).

Each (loop, size) runs in a fresh Python process, so its peak RSS (the kernel's VmHWM,
`resident.peak_mib`) is that run's alone, and trains for the same number of batches
at every size (compute equal, only the data size differs):
- staged: XtremeDistil D4.2 through `student_run.staged_sources` + `staged.train_student`, the
  code `bin/train --method=xtremedistil` runs, one epoch per unfreeze step, the transfer epoch cut
  to `--memory_steps` batches *after* the pipeline's shuffle (so the shuffle buffer fills from
  the whole cache, as in a real epoch); the labeled stage runs its 63 batches of 2,000 windows.
- multigrained: the hard + seq_ce `MultiGrainedStep` of `methods/multigrained.py` on the stream its
  `train_multigrained` builds (`_stream`: select keys, shuffle with `shuffle_buffer`, batch,
  trim) over `read_sharded` of the cache, as `student_run.distil_multigrained` reads it, cut to
  `--memory_steps` batches after the shuffle; the epoch loop's bookkeeping and dev scoring are
  left out.
Both students are small BiLSTMs (E=50, H=64 per direction): their weights are the same at every
size, so they only shift the baseline. `--repeats` is not used.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf
from absl import flags

from xtremedistil_tf import resident
from xtremedistil_tf.methods import multigrained as mg
from xtremedistil_tf.methods.staged import DistilConfig, train_student
from xtremedistil_tf.methods.student_run import staged_sources
from xtremedistil_tf.students import build_bilstm_student
from xtremedistil_tf.students.crf_student import build_bilstm_crf_student
from xtremedistil_tf.transfer.cache import read_sharded, write_sharded

SEQ, HIDDEN, KBEST, VOCAB = 64, 384, 5, 30522
LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]  # + X, [CLS], [SEP], [PAD]: 11 tags
TAGS = len(LABELS) + 4
PAD_ID = TAGS - 1
LABELED = 2_000
DEV = 512
BATCH = 32
SHARD = 1_000
EMBEDDING, UNITS = 50, 64
LOOPS = ("staged", "multigrained")


def define_flags() -> None:
    """This benchmark's flags; call before flags are parsed (bin/benchmark does). Idempotent."""
    definitions = [
        ("memory_sizes", "10000,100000", "memory: transfer-set sizes (windows), comma-separated."),
        ("memory_loops", ",".join(LOOPS), "memory: training loops to measure: staged, multigrained."),
        ("memory_dir", "", "memory: where to write the caches (default: a new dir under $TMPDIR); removed after."),
    ]
    for name, default, help_text in definitions:
        if name not in flags.FLAGS:
            flags.DEFINE_string(name, default, help_text)
    if "memory_steps" not in flags.FLAGS:
        flags.DEFINE_integer("memory_steps", 300, "memory: training batches per run (of 32 windows).")
    if "memory_hidden" not in flags.FLAGS:
        flags.DEFINE_integer("memory_hidden", HIDDEN, "memory: the teacher's hidden size H the cache holds and the "
                             "staged student projects to (384: MiniLM; 768: all-mpnet-base-v2).")
    if "memory_shuffle_buffer" not in flags.FLAGS:
        flags.DEFINE_integer("memory_shuffle_buffer", 0,
                             "memory: multigrained shuffle_buffer (0: MultiGrainedConfig's default).")


def window_outputs(start: int, end: int, labeled: int = LABELED, seq: int = SEQ, hidden: int = HIDDEN,
                   kbest: int = KBEST) -> Dict[str, np.ndarray]:
    """Synthetic teacher outputs of windows [start, end): random, deterministic in `start`, zeros past
    each window's length (mean ~15 pieces, as WikiAnn under MiniLM), [PAD] tags from `labeled` on."""
    rng = np.random.default_rng(start)
    rows = end - start
    lengths = np.clip(3 + rng.poisson(12, rows), 3, seq)
    real = np.arange(seq)[None, :] < lengths[:, None]
    ids = np.where(real, rng.integers(1000, VOCAB, (rows, seq)), 0).astype(np.int32)
    tags = np.where(real, rng.integers(0, len(LABELS), (rows, seq)), PAD_ID).astype(np.int32)
    tags[start + np.arange(rows) >= labeled] = PAD_ID
    kbest_tags = np.where(real[:, None], rng.integers(0, len(LABELS), (rows, kbest, seq)), 0).astype(np.uint8)
    probs = np.sort(rng.dirichlet(np.ones(kbest + 1), rows)[:, :kbest], axis=1)[:, ::-1].astype(np.float32)
    marginals = rng.dirichlet(np.ones(TAGS), (rows, seq)).astype(np.float32) * real[..., None]
    return {
        "input_ids": ids, "attention_mask": real.astype(np.int32), "label_ids": tags,
        "logits": (rng.standard_normal((rows, seq, TAGS), dtype=np.float32) * real[..., None]),
        "hidden": (rng.standard_normal((rows, seq, hidden), dtype=np.float32) * real[..., None]),
        "kbest_tags": kbest_tags, "kbest_probs": np.ascontiguousarray(probs),
        "kbest_valid": np.ones((rows, kbest), bool), "residual": 1.0 - probs.sum(1),
        "marginals": marginals,
    }


def write_cache(directory, size: int, labeled: int = LABELED, **shape) -> dict:
    """A complete cache of `size` synthetic windows in `directory` (`write_sharded`, hidden as float16)."""
    return write_sharded(directory, size, lambda rows: window_outputs(int(rows[0]), int(rows[-1]) + 1, labeled, **shape),
                         shard_size=SHARD, batch_size=250, dtypes={"hidden": "float16"},
                         fingerprint={"benchmark": "memory", "labeled": labeled, **shape}, progress=False)


def train_staged(transfer_dir, dev_dir, steps: int, hidden: int = HIDDEN) -> Dict[str, float]:
    """D4.2 on the cache through the pipeline's staged_sources and train_student (see module doc)."""
    config = DistilConfig(pad_id=PAD_ID, epochs_per_layer=1, patience=None, batch_size=BATCH, seed=0)
    tf.keras.utils.set_random_seed(config.seed)
    train_for, transfer_for, dev_ds = staged_sources(config, transfer_dir, dev_dir, LABELED)
    student = build_bilstm_student(VOCAB, TAGS, embedding_dim=EMBEDDING, hidden=UNITS, teacher_hidden=hidden)
    before, start = resident.rss_mib(), time.perf_counter()
    history = train_student("D4.2", student, train_for, lambda seed: transfer_for(seed).take(steps), dev_ds, config)
    return {"rss_before_mib": before, "seconds": time.perf_counter() - start, "fits": len(history.steps)}


def train_multigrained_steps(transfer_dir, steps: int, shuffle_buffer: int = 0) -> Dict[str, float]:
    """`steps` multi-grained (hard + seq_ce) steps on train_multigrained's stream of the cache."""
    options = {"shuffle_buffer": shuffle_buffer} if shuffle_buffer else {}
    config = mg.MultiGrainedConfig(losses=("hard", "seq_ce"), batch_size=BATCH, kbest=KBEST, seed=0, **options)
    tf.keras.utils.set_random_seed(config.seed)
    transfer = read_sharded(transfer_dir)
    keys = mg._needed_keys(config.losses, list(transfer.element_spec))
    train = mg._stream(transfer, keys, config, shuffle=True, pad_id=PAD_ID).take(steps)
    student = build_bilstm_crf_student(VOCAB, TAGS, None, embedding_dim=EMBEDDING, hidden=UNITS)
    # The engine's step (what Keras' fit traces), compiled once for every batch shape.
    train_step = tf.function(mg.MultiGrainedStep(student, config, PAD_ID).train_step,
                             input_signature=[train.element_spec])
    before, start, first, done = resident.rss_mib(), time.perf_counter(), None, 0
    for batch in train:
        if first is None:
            first = time.perf_counter() - start
        train_step(batch)
        done += 1
    return {"rss_before_mib": before, "seconds": time.perf_counter() - start, "first_batch_s": first,
            "batches": done, "shuffle_buffer": config.shuffle_buffer}


def child(loop: str, transfer_dir: str, dev_dir: str, steps: int, shuffle_buffer: int = 0,
          hidden: int = HIDDEN) -> dict:
    """One measurement, in this (fresh) process: the loop's numbers plus peak RSS."""
    if loop == "staged":
        result = train_staged(transfer_dir, dev_dir, steps, hidden)
    elif loop == "multigrained":
        result = train_multigrained_steps(transfer_dir, steps, shuffle_buffer)
    else:
        raise ValueError(f"unknown loop {loop!r}; expected one of {LOOPS}")
    return {"loop": loop, "peak_rss_mib": resident.peak_mib(), **result}


def measure(loop: str, transfer_dir, dev_dir, steps: int, shuffle_buffer: int = 0, hidden: int = HIDDEN) -> dict:
    """Run `child` in a new Python process; its JSON result."""
    return child_json("xtremedistil_tf.benchmarks.memory", loop, transfer_dir, dev_dir, steps, shuffle_buffer, hidden)


def child_json(module: str, *args) -> dict:
    """`python -m module args...` in a fresh process (this checkout on its path): the JSON of its last line."""
    command = [sys.executable, "-m", module, *map(str, args)]
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cache_bytes(directory) -> int:
    return sum(p.stat().st_size for p in Path(directory).iterdir())


def benchmark(sizes: Sequence[int], loops: Sequence[str], steps: int, root=None,
              shuffle_buffer: int = 0, hidden: int = HIDDEN) -> List[str]:
    """Write the caches, measure every (loop, size) in its own process, delete the caches."""
    unknown = [loop for loop in loops if loop not in LOOPS]
    if unknown:
        raise ValueError(f"unknown loop(s) {unknown}; expected some of {LOOPS}")
    root = Path(tempfile.mkdtemp(prefix="xd_memory_", dir=root or None))
    lines = [f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}; "
             f"cache: T={SEQ} N={TAGS} H={hidden} (float16) K={KBEST}, {LABELED:,} labeled windows first; "
             f"{steps} batches of {BATCH} per run, each run in a fresh process"]
    results = {}
    try:
        start = time.perf_counter()
        write_cache(root / "dev", DEV, labeled=DEV, hidden=hidden)
        for size in sizes:
            write_cache(root / f"transfer_{size}", size, hidden=hidden)
            lines.append(f"cache {size:>7,} windows: {_cache_bytes(root / f'transfer_{size}') / 2**30:.2f} GiB "
                         f"on disk (written in {time.perf_counter() - start:.0f} s)")
            start = time.perf_counter()
        lines.append(f"{'loop':<14}{'windows':>9}{'RSS before':>12}{'peak RSS':>10}{'vs first':>10}"
                     f"{'seconds':>9}  notes")
        for loop in loops:
            for size in sizes:
                r = measure(loop, root / f"transfer_{size}", root / "dev", steps, shuffle_buffer, hidden)
                results[(loop, size)] = r
                base = results[(loop, sizes[0])]["peak_rss_mib"]
                notes = (f"{r['fits']} fits" if loop == "staged" else
                         f"shuffle_buffer {r['shuffle_buffer']:,}, first batch after {r['first_batch_s']:.1f} s")
                lines.append(f"{loop:<14}{size:>9,}{r['rss_before_mib']:>9.0f} MiB{r['peak_rss_mib']:>6.0f} MiB"
                             f"{r['peak_rss_mib'] / base:>9.2f}x{r['seconds']:>9.0f}  {notes}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return lines


def run(repeats: int) -> List[str]:
    FLAGS = flags.FLAGS
    sizes = [int(s) for s in FLAGS.memory_sizes.split(",") if s.strip()]
    loops = [s.strip() for s in FLAGS.memory_loops.split(",") if s.strip()]
    return benchmark(sizes, loops, FLAGS.memory_steps, FLAGS.memory_dir or None, FLAGS.memory_shuffle_buffer,
                     FLAGS.memory_hidden)


if __name__ == "__main__":
    loop_, transfer_, dev_, steps_, buffer_, hidden_ = sys.argv[1:7]
    print(json.dumps(child(loop_, transfer_, dev_, int(steps_), int(buffer_), int(hidden_))), flush=True)
