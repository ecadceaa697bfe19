"""bin/ablate: distil every chosen strategy from one teacher and one teacher-output cache.

    bin/ablate --flagfile=configs/wikiann.flags --data_dir=/path/to/wikiann --langs=en,de \
        --work_dir=runs/ablate --strategies=D0,D0-S,D4.2

Takes every flag of bin/train (defined by importing xtremedistil_tf.cli.train; --strategy is
replaced by each of --strategies in turn). Rerunning the same command resumes at the first
unfinished strategy. Writes <work_dir>/ablation.md (docs/ablation.md explains the tables) and
prints its Table 3.
"""
from __future__ import annotations

import sys

from absl import app, flags

from xtremedistil_tf.ablate import ALL_STRATEGIES
from xtremedistil_tf.cli import train as train_cli
from xtremedistil_tf.cli.common import log_to_work_dir, run_main

FLAGS = flags.FLAGS

flags.DEFINE_list("strategies", list(ALL_STRATEGIES),
                  f"Strategies to compare, in report order; any of {', '.join(ALL_STRATEGIES)}.")


def ablate() -> None:
    from xtremedistil_tf.ablate import check_strategies, run_ablation, table3_markdown

    strategies = check_strategies(FLAGS.strategies)
    cfg = train_cli.config_from_flags()
    log_to_work_dir(cfg.work_dir)
    run_ablation(cfg, strategies)
    print(table3_markdown(cfg.work_dir, strategies), file=sys.stdout, flush=True)
    print(f"\nfull report: {cfg.work_dir}/ablation.md", file=sys.stdout, flush=True)


def main(argv) -> None:
    del argv
    run_main(ablate)


def run() -> None:
    app.run(main)
