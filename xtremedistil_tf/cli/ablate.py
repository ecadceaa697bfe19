"""bin/ablate: distil every chosen strategy (or multi-grained variant) from one teacher and one
teacher-output cache.

    bin/ablate --flagfile=configs/wikiann.flags --data_dir=/path/to/wikiann --langs=en,de \
        --work_dir=runs/ablate --strategies=D0,D0-S,D4.2
    bin/ablate ... --strategies=D0-S,D1,D3.2,D4.1,D4.2 --seeds=1,2,3   # a student per strategy and seed
    bin/ablate ... --strategies=D0-S,D4.2 --transfer_sizes=0,10000      # and per unlabeled-set size
    bin/ablate --flagfile=configs/msra.flags --data_dir=/path/to/msra --work_dir=runs/msra-ablate \
        --variants=vanilla,TE,TE+SEQ,TE+DA,TE+DA+SEQ
    bin/ablate ... --method=multigrained --variants=vanilla,TE+DA+SEQ,TE+DA+SEQ@equal --seeds=1,2,3

Takes every flag of bin/train (defined by importing xtremedistil_tf.cli.train). With
--method=xtremedistil, --strategy is replaced by each of --strategies in turn; with
--method=multigrained, each of --variants sets --student_embeddings, --mg_losses,
--loss_weighting and --use_unlabeled. With --seeds, each strategy (or variant) is distilled once
per seed from the same teacher and cache, and ablation.md reports the mean ± std over seeds, each
seed's F1 and, seed by seed, Table 3's ordering (uncertainty against equal weighting for variants).
With --transfer_sizes, each strategy that reads the transfer set is also distilled from N of its
unlabeled sentences for each N, and ablation.md adds that table with transfer_curve.png. Rerunning
the same command resumes at the first unfinished student. Writes <work_dir>/ablation.md
(docs/ablation.md explains the tables) and prints its Table 3 (XtremeDistil) or the whole report
(multi-grained).
"""
from __future__ import annotations

import sys

from absl import flags

from xtremedistil_tf.cli import train as train_cli
from xtremedistil_tf.cli.common import command, log_to_work_dir
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.run.ablate import (
    ALL_STRATEGIES,
    check_seeds,
    check_strategies,
    check_transfer_sizes,
    run_ablation,
    table3_markdown,
)
from xtremedistil_tf.run.ablate_multigrained import DEFAULT_VARIANTS, VARIANTS, check_variants, run_variants

FLAGS = flags.FLAGS

flags.DEFINE_list("strategies", list(ALL_STRATEGIES),
                  f"--method=xtremedistil: strategies to compare, in report order; any of {', '.join(ALL_STRATEGIES)} "
                  "(Table 3, the default), and D4.2-KD (not in the paper: D4.2 with the teacher's soft targets in its "
                  "labels stage).")
flags.DEFINE_list("seeds", None,
                  "Distil every strategy (--method=multigrained: variant) once per seed (comma-separated "
                  "non-negative integers, e.g. 1,2,3), each student in ablate/seed-<n>/<name>/, from one teacher "
                  "and one teacher-output cache (--seed makes those); ablation.md gives the mean ± std over seeds. "
                  "Default: one student per strategy or variant, of --seed.")
flags.DEFINE_list("transfer_sizes", None,
                  "--method=xtremedistil: also distil each strategy that reads the transfer set from the labeled "
                  "sentences and only N evenly spaced unlabeled ones, for each N given (e.g. 0,10000; fewer than the "
                  "data's unlabeled sentences), each student in ablate/[seed-<n>/]transfer-<N>/<strategy>/ from the same "
                  "teacher and cache; ablation.md adds F1 by size (Table 3 over transfer data) and transfer_curve.png. "
                  "Default: the whole transfer set only.")
flags.DEFINE_list("variants", list(DEFAULT_VARIANTS),
                  "--method=multigrained: students to compare, in run order (default: every row of the paper's "
                  f"Tables 1-3); any of {', '.join(v.name for v in VARIANTS)}.")


def _refuse_other_method_flag() -> None:
    used, other = ("variants", "strategies") if FLAGS.method == "multigrained" else ("strategies", "variants")
    if FLAGS[other].present:
        raise ConfigError(f"--{other} does not apply to --method={FLAGS.method}; use --{used}")
    if FLAGS.method == "multigrained" and FLAGS["transfer_sizes"].present:
        raise ConfigError("--transfer_sizes is for --method=xtremedistil's strategies; the multi-grained variants "
                          "take the unlabeled text whole (DA) or not at all")


def ablate() -> None:
    _refuse_other_method_flag()
    multigrained = FLAGS.method == "multigrained"
    names = check_variants(FLAGS.variants) if multigrained else check_strategies(FLAGS.strategies)
    seeds = check_seeds(FLAGS.seeds) if FLAGS["seeds"].present else None
    sizes = check_transfer_sizes(FLAGS.transfer_sizes) if FLAGS["transfer_sizes"].present else None
    cfg = train_cli.config_from_flags()
    if not multigrained and "D0" in names and cfg.student.arch.case_dim:
        raise ConfigError(f"--student_case_dim={cfg.student.arch.case_dim}: D0's per-language students are trained "
                          "without word shapes; drop D0 from --strategies (D0-S trains on every language) or the flag")
    log_to_work_dir(cfg.work_dir)
    if multigrained:
        print(run_variants(cfg, names, seeds), file=sys.stdout, flush=True)
    else:
        run_ablation(cfg, names, seeds, sizes)
        print(table3_markdown(cfg.work_dir, names, seeds), file=sys.stdout, flush=True)
    print(f"\nfull report: {cfg.work_dir}/ablation.md", file=sys.stdout, flush=True)


main, run = command(ablate, __doc__, 'bin/ablate --flagfile=configs/wikiann.flags --data_dir=DIR --langs=en,de --work_dir=runs/ablate --strategies=D0,D0-S,D4.2')
