"""Multi-grained ablation over one work dir: Tables 1-3 of Zhou et al. (NAACL 2021) for your data.

`bin/ablate --method=multigrained` runs the data, teacher (BERT+CRF) and teacher-output (k-best
surrogates) steps once, then distils one BiLSTM+CRF (or transformer+CRF) student per variant
from the same cache, each its own resumable step (`run/ablate.py` does the same for XtremeDistil's
strategies):

    work_dir/ablate/<variant>/step.json   scores on dev/test, MultiGrainedHistory, timings
    work_dir/ablate/<variant>/            the saved CRF student (methods/student_run.py layout)
    work_dir/ablate/seed-<n>/<variant>/   with --seeds: the student of seed n (same layout)
    work_dir/ablation.md                  Tables 1-3 (rewritten on each run: it is a summary)

With --seeds (bin/ablate --method=multigrained --seeds=1,2,3) every variant is distilled once per
seed from the same teacher and cache, as run/ablate.py does for the strategies; Tables 1-3 then give
the mean ± std over seeds, a Seeds table each seed's F1, and uncertainty against equal weighting
is checked seed by seed (the report code is run/ablate.py's).

A variant is data: the four MultiGrainedConfig settings it sets (arch.embeddings, losses,
weighting, use_unlabeled). Every other student setting (K, epochs, sizes, rates) comes from the flags.
SEQ is the paper's L^u_Seq-all (Eq. 8-9): hard + seq_fuzzy + seq_ce.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.ablate import (REPORT, _over_seeds, _pct, _split, _summary_f1, check_names, check_seeds,
                                    ordering_table, seed_results, seeded_students, seeds_section, strategy_step,
                                    upstream_steps)
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_text, markdown_table as _table
from xtremedistil_tf.run.workdir import WorkDir

log = logging.getLogger(__name__)

HARD = ("hard",)
TOKEN_EM = ("hard", "token_em")
TOKEN_POS = ("hard", "token_pos")
SEQ = ("hard", "seq_fuzzy", "seq_ce")                                  # L^u_Seq-all (Eq. 8)
ALL = ("hard", "seq_fuzzy", "seq_ce", "token_em", "token_pos")
EQUAL = "@equal"                                                       # name suffix of equal weighting


@dataclass(frozen=True)
class Variant:
    """One student of the ablation: the MultiGrainedConfig settings it overrides."""

    name: str
    losses: Tuple[str, ...]
    unlabeled: bool                  # DA: the unlabeled transfer windows join the labeled ones
    embeddings: str = "teacher"      # TE: the teacher's word embeddings, frozen; vanilla: random
    weighting: str = "uncertainty"   # Eq. 9 (auto), or equal (Table 3)
    default: bool = True             # in the default --variants

    def apply(self, student):
        """`student` (a MultiGrainedConfig) with this variant's four settings."""
        return replace(student, arch=replace(student.arch, embeddings=self.embeddings), losses=self.losses,
                       use_unlabeled=self.unlabeled, weighting=self.weighting)


def _equal(variant: Variant, default: bool = True) -> Variant:
    return replace(variant, name=variant.name + EQUAL, weighting="equal", default=default)


_T1 = (Variant("vanilla", HARD, False, embeddings="random"),
       Variant("vanilla+DA", HARD, True, embeddings="random", default=False),
       Variant("TE", HARD, False),
       Variant("TE+TOKEN-EM", TOKEN_EM, False),
       Variant("TE+TOKEN-POS", TOKEN_POS, False),
       Variant("TE+SEQ", SEQ, False),
       Variant("TE+DA", HARD, True),
       Variant("TE+DA+TOKEN-EM", TOKEN_EM, True),
       Variant("TE+DA+TOKEN-POS", TOKEN_POS, True),
       Variant("TE+DA+SEQ", SEQ, True))
_T2 = (Variant("TE+DA+SEQ+TOKEN-POS", SEQ + ("token_pos",), True),
       Variant("TE+DA+SEQ-FUZZY", ("hard", "seq_ce"), True),
       Variant("TE+DA+SEQ-CE", ("hard", "seq_fuzzy"), True),
       Variant("TE+DA+ALL", ALL, True))
_TE_ALL = Variant("TE+ALL", ALL, False, default=False)   # Table 3's all-loss row without DA
_BY_NAME = {v.name: v for v in _T1 + _T2}
_T3 = (_TE_ALL, _equal(_BY_NAME["TE+SEQ"]), _equal(_BY_NAME["TE+DA+SEQ"]), _equal(_TE_ALL, default=False),
       _equal(_BY_NAME["TE+DA+ALL"]))

VARIANTS: Tuple[Variant, ...] = _T1 + _T2 + _T3
DEFAULT_VARIANTS = tuple(v.name for v in VARIANTS if v.default)

# What each table lists, in this order (only the variants of the run appear).
TABLE1 = tuple(v.name for v in _T1)                                  # paper's Table 1 (+ vanilla+DA)
TABLE2 = ("TE+DA+SEQ", "TE+DA+SEQ+TOKEN-POS", "TE+DA+SEQ-FUZZY", "TE+DA+SEQ-CE",   # paper's Table 2 rows,
          "TE+DA", "TE+DA+TOKEN-EM", "TE+DA+TOKEN-POS", "TE+DA+ALL")             # then more combinations
TABLE3 = tuple((v.name[:-len(EQUAL)], v.name) for v in _T3 if v.weighting == "equal")   # (auto, equal) pairs
VANILLA = "vanilla"
TEACHER_ROW = "BERT+CRF (teacher)"


def get_variant(name: str) -> Variant:
    for variant in VARIANTS:
        if variant.name == name:
            return variant
    raise ConfigError(f"unknown variant {name!r}; expected one of {', '.join(v.name for v in VARIANTS)}")


def check_variants(names: Sequence[str]) -> List[str]:
    """Validate before anything trains, so a typo does not surface after hours of teacher work."""
    return check_names(names, "variants", get_variant, "vanilla,TE,TE+DA+SEQ")


def check_config(cfg: pipeline.RunConfig) -> None:
    """The run must cache the CRF teacher's k-best paths for the student's K."""
    sc = cfg.student
    if sc is None:
        raise ConfigError("an ablation distils students; drop --nostudent")
    if sc.method != "multigrained":
        raise ConfigError(f"--variants are the multi-grained method's; --method={sc.method} compares --strategies")
    if cfg.teacher.head != "crf":
        raise ConfigError(f"the multi-grained variants distil a CRF teacher's k-best paths, but "
                          f"--teacher_head={cfg.teacher.head}; add --teacher_head=crf")
    if cfg.transfer.kbest < sc.kbest:
        raise ConfigError(f"the students use K={sc.kbest} surrogates but the teacher-output cache keeps "
                          f"{cfg.transfer.kbest}; set --kbest for both")


def run_variants(cfg: pipeline.RunConfig, variants: Sequence[str], seeds: Optional[Sequence] = None) -> str:
    """Run (or resume) the multi-grained ablation; writes and returns the markdown report.

    seeds: None for one student per variant (of cfg.student.seed), or the student seeds of --seeds:
    one student per variant and seed (ablate/seed-<n>/<variant>/), from the same teacher and cache."""
    variants = check_variants(variants)
    seeds = None if seeds is None else check_seeds(seeds)
    check_config(cfg)
    work, fingerprint = upstream_steps(cfg)
    if work.step_info("data").get("transfer_sentences", 0) == 0 and any(get_variant(n).unlabeled for n in variants):
        log.warning("no unlabeled transfer sentences (--transfer_file): the +DA variants see the labeled windows only")
    for seed, student in seeded_students(cfg.student, seeds):
        for name in variants:
            variant_cfg = replace(cfg, student=get_variant(name).apply(student))
            pipeline.step_student(work, variant_cfg, fingerprint, strategy_step(name, seed))
    report = ablation_report(work, variants, seeds)
    atomic_write_text(work.path(REPORT), report)
    return report


# ----------------------------------------------------------------------------- report
#
# results: {variant: [step info of each seed's student]} (one info without --seeds). A cell is the
# value of the one run, or the mean ± std (n - 1) over the seeds; a gain is the mean ± std of the
# per-seed gains (each seed's student against the same seed's reference).

Runs = Optional[List[dict]]


def _f1(info: Optional[dict], split: str) -> Optional[float]:
    scores = None if info is None else info["scores"].get(split)
    return None if scores is None else _summary_f1(scores)


def _values(runs: Runs, value) -> Optional[List[float]]:
    """`value(info)` of each seed's run; None when the variant did not run or a run lacks the value."""
    values = None if runs is None else [value(info) for info in runs]
    return None if values is None or any(v is None for v in values) else values


def _f1s(runs: Runs, split: str) -> Optional[List[float]]:
    return _values(runs, lambda info: _f1(info, split))


def _cell(values: Optional[List[float]]) -> str:
    return "–" if values is None else _over_seeds(values)


def _delta(values: Optional[List[float]], reference: Optional[List[float]]) -> str:
    if values is None or reference is None:
        return "–"
    gains = np.subtract(values, reference)
    mean = f"{100 * float(np.mean(gains)):+.2f}"
    return mean if len(gains) == 1 else f"{mean} ± {_pct(float(np.std(gains, ddof=1)))}"


def _losses(variant: Variant) -> str:
    return " + ".join(variant.losses)


def table1(teacher_scores: Dict[str, dict], results: Dict[str, List[dict]]) -> List[str]:
    """Dev and test F1 of the teacher and each Table 1 variant, and the gain over vanilla."""
    vanilla = results.get(VANILLA)
    header = ["model", "dev F1", "↑ dev", "test F1", "↑ test"]

    def row(model: str, runs: List[dict], gain: bool = True) -> List[str]:
        cells = []
        for split in ("dev", "test"):
            f1s, reference = _f1s(runs, split), _f1s(vanilla, split)
            # The teacher is one run: its gain is over the mean of vanilla's seeds.
            cells += [_cell(f1s), _delta(f1s, reference) if gain else
                      _delta(f1s, None if reference is None else [float(np.mean(reference))])]
        return [model, *cells]

    rows = [row(TEACHER_ROW, [{"scores": teacher_scores}], gain=False)]
    rows += [row(name, results[name]) for name in TABLE1 if name in results]
    return _table(header, rows)


def table2(results: Dict[str, List[dict]]) -> List[str]:
    """Loss combinations on TE+DA: dev F1, test precision, recall and F1, the gain over vanilla."""
    vanilla = _f1s(results.get(VANILLA), "test")
    header = ["model", "losses", "dev F1", "test P", "test R", "test F1", "↑ test"]
    rows = []
    for name in TABLE2:
        if name in results:
            runs = results[name]

            def pooled(key, runs=runs):
                return _cell(_values(runs, lambda info: info["scores"].get("test", {}).get("all", {}).get(key)))

            f1s = _f1s(runs, "test")
            rows.append([name, _losses(get_variant(name)), _cell(_f1s(runs, "dev")), pooled("precision"),
                         pooled("recall"), _cell(f1s), _delta(f1s, vanilla)])
    return _table(header, rows)


def table3(results: Dict[str, List[dict]]) -> List[str]:
    """Uncertainty (auto, Eq. 9) against equal weighting of the same losses, without and with DA."""
    header = ["losses", "DA", "auto dev", "auto test", "equal dev", "equal test", "auto − equal (test)"]
    rows = []
    for auto, equal in TABLE3:
        if auto in results or equal in results:
            a, e = results.get(auto), results.get(equal)
            variant = get_variant(auto)
            rows.append([_losses(variant), "yes" if variant.unlabeled else "no", _cell(_f1s(a, "dev")),
                         _cell(_f1s(a, "test")), _cell(_f1s(e, "dev")), _cell(_f1s(e, "test")),
                         _delta(_f1s(a, "test"), _f1s(e, "test"))])
    return _table(header, rows)


def _lambdas(history: dict) -> str:
    """The loss weights of the kept (best) epoch; the starting weights when no epoch beat them."""
    if not history["best_epoch"]:
        return "start"
    lambdas = history["epochs"][history["best_epoch"] - 1]["lambdas"]
    return ", ".join(f"{name} {value:.3g}" for name, value in lambdas.items())


def runs_table(results: Dict[str, List[dict]], seeds: Optional[Sequence[int]] = None) -> List[str]:
    """What each variant set and how its training went, in run order (with --seeds, a row per seed,
    after the variant's name). A step info's `token_loss` (ce or kl, from the student's fingerprint)
    follows the losses of a variant with token losses."""
    header = ["model", *(["seed"] if seeds else []), "embeddings", "losses", "weighting", "DA", "best epoch / run",
              "λ (best epoch)", "train s"]
    rows = []
    for name, runs in results.items():
        v = get_variant(name)
        for seed, info in zip(seeds or [None], runs):
            history = info["history"]
            losses = _losses(v) + (f" (token losses: {info['token_loss']})" if info.get("token_loss") else "")
            rows.append([name, *([str(seed)] if seeds else []), v.embeddings, losses, v.weighting,
                         "yes" if v.unlabeled else "no", f"{history['best_epoch']} / {len(history['epochs'])}",
                         _lambdas(history), f"{info['train_seconds']:.0f}"])
    return _table(header, rows)


def render_report(root, data_info: dict, teacher_scores: Dict[str, dict], results: Dict[str, List[dict]],
                  seeds: Optional[Sequence[int]] = None) -> str:
    """The markdown of ablation.md from the data step's counts, the teacher's and the variants' step
    infos (results: {variant: [info of each seed]}), and the --seeds they ran with (None: one run each)."""
    counts = ", ".join(f"{data_info.get(f'{split}_sentences', 0):,} {split}" for split in ("train", "dev", "test"))
    unlabeled = data_info.get("transfer_sentences", 0)
    several = (" Students: mean ± standard deviation (n - 1) over the seeds; ↑ and auto − equal: the mean ± std of "
               "the per-seed differences (each seed's student against the same seed's); the teacher is one run."
               if seeds else "")
    lines = ["# Multi-grained distillation ablation", "", f"Work dir: `{root}`", "",
             f"Sentences: {counts}; {unlabeled:,} unlabeled transfer sentences (DA)"
             + (" — none, so +DA variants train on the labeled windows only." if not unlabeled else "."), "",
             "F1 (%) is entity F1 (the mean across languages when sentences carry one); ↑ is the gain over "
             "`vanilla` in points (– without a vanilla run). P and R are pooled over all sentences." + several, "",
             "## Table 1: embeddings, distillation losses and data augmentation", "", *table1(teacher_scores, results),
             "", "## Table 2: loss combinations (TE+DA)", "", *table2(results),
             "", "## Table 3: uncertainty (auto) against equal loss weighting", "", *table3(results)]
    if seeds:
        split = _split(teacher_scores)
        order = [(auto, ">=", equal) for auto, equal in TABLE3]
        lines += ["", *seeds_section(split, seeds, results, "variant"),
                  "", f"## Uncertainty against equal weighting, seed by seed: {split} F1 (%)", "",
                  "For each Table 3 pair that was run: whether uncertainty weighting's F1 (the mean across "
                  "languages, or F1) reached equal weighting's, seed by seed.", "",
                  *ordering_table(split, seeds, results, order, "No auto and equal pair of Table 3 was run.")]
    lines += ["", "## Variants", "",
              "Each student's settings, the epoch kept (best dev F1; 0: no epoch beat the starting weights) "
              "out of the epochs run, and the loss weights λ of that epoch.", "", *runs_table(results, seeds)]
    return "\n".join(lines) + "\n"


def _with_token_loss(work: WorkDir, step: str) -> dict:
    """The step info of a variant's student, with its `token_loss` (ce or kl) when it has token losses."""
    token_loss = work.stored(step)["fingerprint"]["student"].get("token_loss")
    return {**work.step_info(step), **({"token_loss": token_loss} if token_loss else {})}


def ablation_report(work: WorkDir, variants: Sequence[str], seeds: Optional[Sequence[int]] = None) -> str:
    results = seed_results(variants, seeds, lambda step: _with_token_loss(work, step))
    return render_report(work.root, work.step_info("data"), work.step_info("teacher")["scores"], results, seeds)
