"""Teacher-output generation throughput with 1, 2, ... worker processes writing one cache (issue 30).

    python -m xtremedistil_tf.benchmarks.transfer_workers --teacher=RUN/teacher/model \\
        --sentences=RUN/data/train.jsonl --count=4000 --workers=1,2 --intra_op_threads=1 --out=/tmp/tw

For each number of workers W: W processes, each given TF_CONFIG for worker w of a W-worker
cluster (localhost addresses: generation opens no port), load the teacher and encode the first
`--count` sentences of the jsonl (a work dir's data snapshot), wait until all are ready, then
write their parts of one cache into `<out>/workers-W` (transfer/cache.py:worker_part, the
pipeline's `write_teacher_outputs`). Windows per second = windows / (the last worker's end - the
common start): loading and encoding are left out. Also printed: windows per CPU-second of the
workers together, which a loaded machine does not skew (W workers without overhead keep the
1-worker value, and W idle cores would then give W times the 1-worker windows per second). Each process keeps to `--intra_op_threads`
(engine/distribute.limit_threads), so W workers on W cores show the scaling. Prints one JSON line
per W and the speed-up over the first W.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from xtremedistil_tf.data.alignment import encode
from xtremedistil_tf.data.loading import read_jsonl
from xtremedistil_tf.engine.distribute import limit_threads, worker_of_cluster
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import worker_part
from xtremedistil_tf.transfer.outputs import compute_window_outputs, teacher_outputs_fn, write_teacher_outputs

CLUSTER_PORT = 20000
MODULE = "xtremedistil_tf.benchmarks.transfer_workers"


def _child(args) -> None:
    limit_threads(args.intra_op_threads)

    index, count = worker_of_cluster()
    teacher, tokenizer = load_teacher(args.teacher)
    sentences = read_jsonl(args.sentences)[:args.count]
    windows = encode(sentences, tokenizer, teacher.tag_vocab, args.max_seq_length)
    run = teacher_outputs_fn(teacher, args.layer)
    compute_window_outputs(run, windows, np.arange(min(len(windows), args.batch_size)))   # trace before the clock starts
    out = Path(args.out)
    (out / f"ready-{index}").write_text("")
    while not (out / "go").exists():
        time.sleep(0.05)
    start, cpu = time.time(), time.process_time()
    with worker_part(index, count):
        manifest = write_teacher_outputs(teacher, windows, out / "cache", args.layer, {"benchmark": "transfer_workers"},
                                         shard_size=args.shard_size, batch_size=args.batch_size, progress=False)
    (out / f"done-{index}.json").write_text(json.dumps({"start": start, "end": time.time(), "cpu": time.process_time() - cpu,
                                                        "windows": manifest["num_examples"]}))


def _run(args, workers: int) -> dict:
    out = Path(args.out) / f"workers-{workers}"
    if out.exists():
        raise SystemExit(f"{out} exists; give another --out")
    out.mkdir(parents=True)
    cluster = [f"localhost:{CLUSTER_PORT + i}" for i in range(workers)]
    procs = []
    for index in range(workers):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": cluster},
                                                      "task": {"type": "worker", "index": index}})}
        # --pin_cores: worker w runs on core w only (taskset, from its first instruction): TensorFlow's thread
        # limits alone still let one process use ~1.8 cores here (measured), which hides the scaling.
        pin = ["taskset", "-c", str(index % os.cpu_count())] if args.pin_cores else []
        procs.append(subprocess.Popen([*pin, sys.executable, "-m", MODULE, "--child", *sys.argv[1:], f"--out={out}"],
                                      env=env))
    while not all((out / f"ready-{i}").exists() for i in range(workers)):
        if any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit("a worker failed before starting")
        time.sleep(0.1)
    go = time.time()
    (out / "go").write_text("")
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a worker exited with {p.returncode}")
    done = [json.loads((out / f"done-{i}.json").read_text()) for i in range(workers)]
    seconds = max(d["end"] for d in done) - go
    return {"workers": workers, "windows": done[0]["windows"], "seconds": round(seconds, 2),
            "windows_per_second": round(done[0]["windows"] / seconds, 2),
            # CPU time of the workers, waiting for each other included (a poll every 0.5 s): on a loaded
            # machine this says what W idle cores would give (windows / CPU-second x W) when wall time cannot.
            "windows_per_cpu_second": round(done[0]["windows"] / sum(d["cpu"] for d in done), 2),
            "load_average": os.getloadavg(), "intra_op_threads": args.intra_op_threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="a saved teacher (<work_dir>/teacher/model)")
    parser.add_argument("--sentences", required=True, help="a jsonl of sentences (<work_dir>/data/train.jsonl)")
    parser.add_argument("--count", type=int, default=4000, help="the first this many sentences")
    parser.add_argument("--workers", default="1,2", help="numbers of workers to time, in order")
    parser.add_argument("--intra_op_threads", type=int, default=1)
    parser.add_argument("--pin_cores", action="store_true",
                        help="run worker w on core w only (taskset): one core each, whatever threads it starts")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--layer", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--shard_size", type=int, default=250)
    parser.add_argument("--out", required=True, help="a new dir for the caches")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.child:
        return _child(args)
    results = [_run(args, int(w)) for w in args.workers.split(",")]
    for r in results:
        print(json.dumps({**r, "speed_up": round(r["windows_per_second"] / results[0]["windows_per_second"], 2)}),
              flush=True)


if __name__ == "__main__":
    main()
