"""Strategy ablation over one work dir: XtremeDistil's Table 3 and Table 4 for your data.

The data, teacher and teacher-output steps run once (pipeline.step_data/step_teacher/
step_transfer); every strategy is then distilled from the same cached teacher outputs into its
own resumable step dir, so a killed ablation resumes at the first unfinished strategy:

    work_dir/ablate/<strategy>/step.json        scores on dev/test, StagedHistory, timings
    work_dir/ablate/<strategy>/                 the saved student (methods/student_run.py layout)
    work_dir/ablate/D0/student-<lang>/          D0 with several languages: one student per language
    work_dir/ablate/seed-<n>/<strategy>/        with --seeds: the student of seed n (same layout)
    work_dir/ablate/[seed-<n>/]transfer-<N>/<strategy>/
                                                with --transfer_sizes: the student that learnt from N
                                                of the unlabeled transfer sentences
    work_dir/ablation.md                        the tables (rewritten on each run: it is a summary)
    work_dir/transfer_curve.png                 with --transfer_sizes: F1 / teacher F1 against N

With --seeds (bin/ablate --seeds=1,2,3) every strategy is distilled once per seed from the same
teacher and cache (--seed still makes the data and the teacher); ablation.md then gives the mean
± std over seeds, each seed's F1, and Table 3's ordering checked seed by seed. Without it there is
one student per strategy, of --seed.

With --transfer_sizes (bin/ablate --transfer_sizes=0,10000) every strategy that reads the transfer
set is also distilled from the labeled sentences plus only N evenly spaced of the unlabeled ones
(pipeline.transfer_subset; the same teacher and cache), for each N: the paper's Table 3 over
transfer-set sizes. ablation.md then has that table (the full set as its last row) and
transfer_curve.png plots each strategy's F1 as a share of the teacher's against N.

D0 trains one student per language on that language's labeled windows, selected on that
language's dev windows, and scores each language with its own student. With one language (or
none) D0 is a single student, the same as D0-S.

The multi-grained method's ablation (its paper's Tables 1-3) is run/ablate_multigrained.py.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from xtremedistil_tf.data.scoring import tag_scores
from xtremedistil_tf.engine.precision import precision_policy
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_text
from xtremedistil_tf.io import markdown_table as _table
from xtremedistil_tf.methods.staged import batched, make_dev_f1, train_student
from xtremedistil_tf.methods.strategies import STRATEGIES, get_strategy
from xtremedistil_tf.methods.student_run import (
    build_student,
    distil_config,
    predict_words,
    save_student,
    served_windows,
)
from xtremedistil_tf.run import pipeline
from xtremedistil_tf.run.report import plot_transfer_curve
from xtremedistil_tf.run.validation import MAX_SEED
from xtremedistil_tf.run.workdir import WorkDir
from xtremedistil_tf.teachers.saved import load_teacher
from xtremedistil_tf.transfer.cache import padding_values, read_sharded, subset

log = logging.getLogger(__name__)

ALL_STRATEGIES = tuple(n for n, s in STRATEGIES.items() if s.paper)   # D0, D0-S, D1, ..., D4.2 (Table 3)
ABLATE_DIR = "ablate"
REPORT = "ablation.md"


# The paper's Table 3 ordering (D4.2 >= D4.1 >= D3.2 > D3.1, D1 > D0-S), as adjacent pairs:
# (better, relation, worse). A pair is checked when both strategies were run.
TABLE3_ORDER = (("D4.2", ">=", "D4.1"), ("D4.1", ">=", "D3.2"), ("D3.2", ">", "D3.1"), ("D1", ">", "D0-S"))



CURVE_PLOT = "transfer_curve.png"


def strategy_step(name: str, seed: Optional[int] = None, transfer: Optional[int] = None) -> str:
    """The step (dir under the work dir) of one strategy, or of its student of one of --seeds, or of
    its student of `transfer` unlabeled sentences (--transfer_sizes; None: all of them)."""
    parts = [ABLATE_DIR, *([f"seed-{seed}"] if seed is not None else []),
             *([f"transfer-{transfer}"] if transfer is not None else []), name]
    return "/".join(parts)


def reads_transfer(name: str) -> bool:
    """Whether a strategy's students learn from the transfer set (else one student serves every size)."""
    return any("transfer" in stage.sources for stage in get_strategy(name).stages)


def check_names(names: Sequence[str], flag: str, lookup: Callable[[str], object], example: str) -> List[str]:
    """`names` of --<flag>, each known to `lookup` (which raises ConfigError otherwise), none twice."""
    names = list(names)
    if not names:
        raise ConfigError(f"--{flag} is empty; give e.g. {example}")
    for name in names:
        lookup(name)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"--{flag} names {repeated} more than once")
    return names


def check_strategies(names: Sequence[str]) -> List[str]:
    """Validate before anything trains, so a typo does not surface after hours of teacher work."""
    return check_names(names, "strategies", get_strategy, "D0,D0-S,D4.2")


def _seed(value) -> int:
    text = str(value).strip()
    if not text.isdigit() or int(text) > MAX_SEED:
        raise ConfigError(f"--seeds: {text!r} is not a non-negative integer up to {MAX_SEED}; give e.g. --seeds=1,2,3")
    return int(text)


def check_seeds(values: Sequence) -> List[int]:
    """The seeds of --seeds (strings or ints): non-negative integers, at least one, none twice."""
    seeds = [_seed(value) for value in values]
    check_names([str(seed) for seed in seeds], "seeds", lambda name: None, "1,2,3")
    return seeds


def check_transfer_sizes(values: Sequence) -> List[int]:
    """The sizes of --transfer_sizes (strings or ints), in increasing order: non-negative integers,
    none twice. Whether the data has that many unlabeled sentences is checked once it is read
    (pipeline.check_transfer_sentences), still before the teacher trains."""
    sizes = []
    for value in values:
        text = str(value).strip().replace("_", "")
        if not text.isdigit():
            raise ConfigError(f"--transfer_sizes: {text!r} is not a number of unlabeled sentences; "
                              "give e.g. --transfer_sizes=0,10000 (the whole set is always run)")
        sizes.append(int(text))
    check_names([str(size) for size in sizes], "transfer_sizes", lambda name: None, "0,10000")
    return sorted(sizes)


def seeded_students(student, seeds: Optional[Sequence[int]]) -> Iterator[Tuple[Optional[int], object]]:
    """(seed, student config of that seed) for each of --seeds in order, or (None, `student`) without
    --seeds. Runs go seed by seed, so a killed run has whole tables for the seeds it finished."""
    for seed in seeds or [None]:
        yield seed, student if seed is None else replace(student, seed=seed)


def seed_results(names: Sequence[str], seeds: Optional[Sequence[int]], load: Callable[[str], dict]
                 ) -> Dict[str, List[dict]]:
    """{name: [step info of each seed's student]} (one info without --seeds); `load` reads the info of a step."""
    return {name: [load(strategy_step(name, seed)) for seed in seeds or [None]] for name in names}


def upstream_steps(cfg: pipeline.RunConfig, check_data: Callable[[WorkDir], None] = lambda work: None
                   ) -> Tuple[WorkDir, dict]:
    """(work dir, fingerprint): the data, teacher and teacher-output steps every student reads, run once;
    `check_data(work)` runs after the data step, before the teacher trains."""
    work = WorkDir(cfg.work_dir, overwrite=cfg.overwrite)
    fingerprint = pipeline.step_data(work, cfg)
    check_data(work)
    fingerprint = pipeline.step_teacher(work, cfg, fingerprint)
    return work, pipeline.step_transfer(work, cfg, fingerprint)


def run_ablation(cfg: pipeline.RunConfig, strategies: Sequence[str], seeds: Optional[Sequence] = None,
                 transfer_sizes: Optional[Sequence] = None) -> str:
    """Run (or resume) the ablation; writes and returns the markdown report.

    seeds: None for one student per strategy (of cfg.student.seed), or the student seeds of
    --seeds: one student per strategy and seed, from the same teacher and cache.
    transfer_sizes: numbers of unlabeled transfer sentences; each strategy that reads the transfer
    set also gets a student (per seed) of each size, after the full-set students.
    Strategies that begin with the same stages (D3.x, D4.x: the representation stage) train them
    once per seed and size: the later ones start from the first one's checkpoint after them."""
    strategies = check_strategies(strategies)
    seeds = None if seeds is None else check_seeds(seeds)
    sizes = [] if transfer_sizes is None else check_transfer_sizes(transfer_sizes)
    if cfg.student is None:
        raise ConfigError("an ablation distils students; drop --nostudent")
    if cfg.student.method != "xtremedistil":
        raise ConfigError(f"--strategies are XtremeDistil's; --method={cfg.student.method} compares --variants "
                          "(ablate_multigrained.run_variants)")
    # One cache serves every strategy, and a later ablation on this work dir may add strategies that read the
    # hidden states: they are always cached here. Top-k logits only when every strategy allows them.
    cfg = replace(cfg, transfer=replace(cfg.transfer, hidden=True))
    for name in strategies:
        pipeline.check_cache(replace(cfg.student, strategy=name), cfg.transfer)

    def check_data(work: WorkDir) -> None:
        unlabeled = len(pipeline.load_data(work)["transfer"])
        for size in sizes:
            pipeline.check_transfer_sentences(size, unlabeled)

    work, fingerprint = upstream_steps(cfg, check_data)
    languages = train_languages(work)
    for seed, student in seeded_students(cfg.student, seeds):
        for size in [None, *sizes]:
            for name in strategies:
                if size is not None and not reads_transfer(name):
                    continue
                strategy_cfg = replace(cfg, student=replace(student, strategy=name, transfer_sentences=size))
                step = strategy_step(name, seed, size)
                if get_strategy(name).per_language and len(languages) > 1:
                    step_per_language(work, strategy_cfg, fingerprint, languages, step)
                else:
                    pipeline.step_student(work, strategy_cfg, fingerprint, step, share_stages=True)
    # Every student that could start from a kept stage is done (a killed run keeps them for its rerun).
    pipeline.clear_shared_stages(work)
    report = ablation_report(work, strategies, seeds, sizes)
    atomic_write_text(work.path(REPORT), report)
    return report


def train_languages(work: WorkDir) -> List[Optional[str]]:
    """Languages of the training sentences, in order of first appearance (the --langs order)."""
    return list(dict.fromkeys(s.lang for s in pipeline.load_data(work)["train"]))


# ----------------------------------------------------------------------------- D0: one student per language

def step_per_language(work: WorkDir, cfg: pipeline.RunConfig, upstream: dict, languages: Sequence[str],
                      step: str):
    """D0 with several languages: a student per language in <step>/student-<lang>/, one step."""
    sc = cfg.student
    fingerprint = {**upstream, "student": pipeline.student_fingerprint(sc)}

    def build(tmp: Path) -> dict:
        splits = pipeline.load_data(work)
        teacher, tokenizer = load_teacher(work.path("teacher") / "model")
        scored = [split for split in ("dev", "test") if splits[split]]
        _check_covered(splits, scored, languages)
        predicted = {split: [None] * len(splits[split]) for split in scored}
        window_langs = cached_window_languages(work, splits, tokenizer, teacher)
        per_language = {}
        for lang in languages:
            start = time.time()
            student, history = _distil_language(work, sc, teacher, tokenizer, splits["dev"], window_langs, lang,
                                                cfg.data.scheme, cfg.progress)
            per_language[lang] = {"history": history.to_dict(), "train_seconds": time.time() - start,
                                  "parameters": int(student.count_params())}
            for split in scored:
                idx = [i for i, s in enumerate(splits[split]) if s.lang == lang]
                # Decoded as pipeline.step_student's scores decode (student_run.evaluate_student).
                tags = predict_words(student, tokenizer, teacher.tag_vocab, teacher.max_seq_length,
                                     [splits[split][i] for i in idx], cfg.data.scheme)
                for i, t in zip(idx, tags):
                    predicted[split][i] = t
            save_student(tmp / f"student-{lang}", student, sc.arch.architecture, tokenizer, teacher.tag_vocab,
                         cfg.data.scheme, teacher.max_seq_length)
        # Pooling every language's own predictions gives the overall score, and per language
        # exactly what that language's student scores on its own sentences.
        seen = pipeline.seen_names(cfg, splits)
        scores = {split: tag_scores(splits[split], predicted[split], cfg.data.scheme, seen) for split in scored}
        return {"per_language": per_language, "scores": scores,
                "train_seconds": sum(v["train_seconds"] for v in per_language.values()),
                "parameters": sum(v["parameters"] for v in per_language.values())}

    with precision_policy(cfg.mixed_precision):
        work.run_step(step, fingerprint, build)
    return fingerprint


def _check_covered(splits: dict, scored: Sequence[str], languages: Sequence[str]) -> None:
    for split in scored:   # dev is never empty (step_data), so it is always checked
        missing = sorted({str(s.lang) for s in splits[split]} - {str(lang) for lang in languages})
        if missing:
            raise ConfigError(f"D0 trains one student per training language ({', '.join(map(str, languages))}); "
                              f"{split} has sentences of {missing} with none in train")
    for lang in languages:
        if not any(s.lang == lang for s in splits["dev"]):
            raise ConfigError(f"D0 selects each language's student on its dev sentences; dev has none of {lang!r}")


def cached_window_languages(work: WorkDir, splits: dict, tokenizer, teacher) -> Dict[str, np.ndarray]:
    """The language of each labeled window of the train and dev teacher-output caches, in cache order.

    Train comes first in the transfer cache (pipeline.cached_sentence_index).
    """
    transfer = work.step_info("transfer")
    expected = {"train": transfer["train_windows"], "dev": transfer["dev"]["windows"]}
    langs = {}
    for split, count in expected.items():
        sentences = splits[split]
        index = pipeline.cached_sentence_index(sentences, tokenizer, teacher, count, f"{split} of {work.root}")
        langs[split] = np.array([sentences[i].lang for i in index], dtype=object)
    return langs


def _distil_language(work: WorkDir, sc, teacher, tokenizer, dev_sentences, window_langs: Dict[str, np.ndarray],
                     lang: str, scheme: str, progress: bool):
    """One D0 student: labeled windows of `lang` from the transfer cache, selected on its dev windows."""
    tf.keras.utils.set_random_seed(sc.seed)
    student = build_student(sc, teacher, scheme)
    keep = window_langs["train"] == lang
    train = subset(read_sharded(work.path("transfer")), keep)
    train_ds = batched(train, sc.batch_size, shuffle_buffer=int(keep.sum()), seed=sc.seed,
                       padding=padding_values(work.path("transfer")))
    dev_ds = batched(subset(read_sharded(work.path("transfer_dev")), window_langs["dev"] == lang), sc.batch_size,
                     padding=padding_values(work.path("transfer_dev")))
    dev = [s for s in dev_sentences if s.lang == lang]
    evaluate_fn = make_dev_f1(served_windows(dev, tokenizer, teacher.tag_vocab, teacher.max_seq_length,
                                             sc.arch.architecture != "transformer"),
                              [s.tags for s in dev], teacher.tag_vocab, scheme)
    log.info("D0 %s: %d train windows, %d dev sentences", lang, int(keep.sum()), len(dev))
    # D0's only stage trains on labels, so no transfer set is given.
    history = train_student(sc.strategy, student, train_ds, None, dev_ds, distil_config(sc, teacher.tag_vocab, progress),
                            evaluate_fn=evaluate_fn)
    return student, history


# ----------------------------------------------------------------------------- report

def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def _summary_f1(scores: dict) -> float:
    """The papers' headline number: mean F1 across languages, or plain F1 without languages."""
    return scores["f1_mean"] if "f1_mean" in scores else scores["all"]["f1"]


def _split(teacher_scores: Dict[str, dict]) -> str:
    """The split the tables report: test when the run has one, else dev."""
    return "test" if "test" in teacher_scores else "dev"


def _over_seeds(values: Sequence[float]) -> str:
    """Per-seed values in %: mean ± sample standard deviation (n - 1) for several, the value for one."""
    if len(values) == 1:
        return _pct(values[0])
    return f"{_pct(float(np.mean(values)))} ± {_pct(float(np.std(values, ddof=1)))}"


def table3(teacher_scores: Dict[str, dict], results: Dict[str, List[dict]],
           argmax_scores: Optional[Dict[str, dict]] = None) -> List[str]:
    """Per model: F1 per language, their mean (and std across languages), pooled F1, and the mean as a
    share of the teacher's. results: {strategy: [step info of each seed]}; with several seeds every
    cell is the mean ± std over the seeds. `teacher_scores`: the teacher step's `scores` (decoded as the
    students are: the 100%); `argmax_scores`: its argmax scores (a softmax token teacher), a row of their own."""
    split = _split(teacher_scores)
    teacher = teacher_scores[split]
    languages = list(teacher.get("languages", {}))
    several = any(len(infos) > 1 for infos in results.values())
    spread = (["mean"] if several else ["mean", "std"]) if languages else []
    header = ["model", "strategy", *languages, *spread, "all", "% of teacher"]
    reference = _summary_f1(teacher)

    def row(model: str, description: str, runs: List[dict]) -> List[str]:
        def cell(value):
            return _over_seeds([value(scores) for scores in runs])
        per = [cell(lambda s, lang=lang: s["languages"][lang]["f1"]) for lang in languages]
        across = [cell(lambda s, key=key: s[key]) for key in ("f1_mean", "f1_std")[:len(spread)]]
        share = f"{np.mean([_summary_f1(scores) for scores in runs]) / reference:.1%}" if reference else "–"
        return [model, description, *per, *across, cell(lambda s: s["all"]["f1"]), share]

    rows = [row("teacher", "fine-tuned teacher" if argmax_scores is None else
                "fine-tuned teacher, decoded as the students (constrained word decoding)", [teacher])]
    if argmax_scores is not None:
        rows.append(row("teacher (argmax)", "the same teacher, its own decoding (argmax at each word's first piece)",
                        [argmax_scores[split]]))
    rows += [row(name, get_strategy(name).description, [info["scores"][split] for info in infos])
             for name, infos in results.items()]
    seeds = (" Students: mean ± standard deviation (n - 1) over the seeds; the teacher is one run."
             if several else "")
    intro = (f"## Strategies (Table 3): {split} F1 (%)\n\n"
             + ("Per language, their mean" + ("" if several else " and standard deviation across languages")
                + ", F1 over all sentences pooled, and the mean as a share of the teacher's mean." if languages else
                "F1 over all sentences, and as a share of the teacher's.") + seeds + "\n")
    return [intro, *_table(header, rows)]


def seeds_section(split: str, seeds: Sequence[int], results: Dict[str, List[dict]], label: str = "strategy"
                  ) -> List[str]:
    """The report's Seeds section: its heading, what it shows, and `per_seed_table`."""
    return [f"## Seeds: {split} F1 (%) of each student", "",
            f"The mean F1 across languages (F1 without languages) of each seed's student (--seeds="
            f"{','.join(map(str, seeds))}; one teacher and one teacher-output cache for all), and their "
            "mean ± standard deviation (n - 1).", "", *per_seed_table(split, seeds, results, label)]


def per_seed_table(split: str, seeds: Sequence[int], results: Dict[str, List[dict]], label: str = "strategy"
                   ) -> List[str]:
    """Each strategy's (or `label`'s) headline F1 (mean across languages, or F1) per seed, and their mean ± std."""
    header = [label, *(f"seed {seed}" for seed in seeds), "mean ± std"]
    rows = []
    for name, infos in results.items():
        values = [_summary_f1(info["scores"][split]) for info in infos]
        rows.append([name, *map(_pct, values), _over_seeds(values)])
    return _table(header, rows)


def ordering_table(split: str, seeds: Sequence[Optional[int]], results: Dict[str, List[dict]],
                   order: Sequence[Tuple[str, str, str]] = TABLE3_ORDER,
                   none_run: str = "No pair of the ordering's strategies was run.") -> List[str]:
    """An ordering ((better, ">=" or ">", worse) pairs; default Table 3's), pair by pair and seed by
    seed, for the pairs whose two students were run (`none_run` when there is none)."""
    pairs = [pair for pair in order if pair[0] in results and pair[2] in results]
    if not pairs:
        return [none_run]
    header = ["ordering", *(f"seed {seed}" if seed is not None else "F1" for seed in seeds), "holds"]
    rows = []
    for better, relation, worse in pairs:
        cells = []
        for a, b in zip(results[better], results[worse]):
            f1_a, f1_b = _summary_f1(a["scores"][split]), _summary_f1(b["scores"][split])
            holds = f1_a >= f1_b if relation == ">=" else f1_a > f1_b
            cells.append(f"{'yes' if holds else 'NO'}: {_pct(f1_a)} vs {_pct(f1_b)}")
        held = sum(cell.startswith("yes") for cell in cells)
        rows.append([f"{better} {relation.replace('>=', '≥')} {worse}", *cells, f"{held} of {len(cells)}"])
    return _table(header, rows)


def table4(history: dict) -> List[str]:
    """Per unfreeze step of a StagedHistory: stage, layers that joined, dev loss and dev F1."""
    header = ["stage", "loss", "unfrozen", "best epoch", "dev loss (start → best)", "dev F1"]
    rows = [[str(s["stage"]), s["stage_name"], " + ".join(s["unfrozen"]), str(s["best_epoch"]),
             f"{s['initial_val_loss']:.4g} → {s['best_val_loss']:.4g}", _pct(s["dev_f1"])]
            for s in history["steps"]]
    return _table(header, rows)


def _load_results(work: WorkDir, strategies: Sequence[str], seeds: Optional[Sequence[int]] = None):
    """(the teacher step's scores, its argmax scores or None, {strategy: [step info of each seed]}) from the
    finished steps (run_ablation's upstream_steps has given an older teacher step its decoded scores)."""
    teacher = work.step_info("teacher")
    return teacher["scores"], teacher.get("argmax_scores"), seed_results(strategies, seeds, work.step_info)


def table3_markdown(work_dir, strategies: Sequence[str], seeds: Optional[Sequence[int]] = None) -> str:
    """Table 3 alone, as bin/ablate prints it."""
    teacher_scores, argmax_scores, results = _load_results(WorkDir(work_dir), strategies, seeds)
    return "\n".join(table3(teacher_scores, results, argmax_scores))


def transfer_results(work: WorkDir, strategies: Sequence[str], seeds: Optional[Sequence[int]],
                     sizes: Sequence[int]) -> Dict[str, Dict[Optional[int], List[dict]]]:
    """{strategy: {size (None: all): [step info of each seed's student]}}; a strategy that reads no
    transfer text has one student for every size."""
    return {name: {size: [work.step_info(strategy_step(name, seed, size if reads_transfer(name) else None))
                          for seed in seeds or [None]] for size in [*sizes, None]}
            for name in strategies}


def transfer_table(split: str, teacher: dict, curve: Dict[str, Dict[Optional[int], List[dict]]],
                   unlabeled: int) -> List[str]:
    """Table 3 over transfer-set sizes: a row per number of unlabeled sentences (all of them last), a
    column per strategy with its F1 (mean ± std over seeds) and share of the teacher's."""
    reference = _summary_f1(teacher)
    sizes = list(next(iter(curve.values())))
    rows = []
    for size in sizes:
        row = [f"{unlabeled:,} (all)" if size is None else f"{size:,}"]
        for by_size in curve.values():
            values = [_summary_f1(info["scores"][split]) for info in by_size[size]]
            row.append(_over_seeds(values) + (f" ({np.mean(values) / reference:.1%})" if reference else ""))
        rows.append(row)
    return _table(["unlabeled sentences", *curve], rows)


def curve_points(split: str, teacher: dict, curve: Dict[str, Dict[Optional[int], List[dict]]], unlabeled: int
                 ) -> Dict[str, List[Tuple[int, float, float]]]:
    """{strategy: [(unlabeled sentences, mean F1 / teacher F1 in %, its std over seeds)]} for the plot."""
    reference = _summary_f1(teacher)
    points = {}
    for name, by_size in curve.items():
        points[name] = []
        for size, infos in by_size.items():
            shares = [100 * _summary_f1(info["scores"][split]) / reference for info in infos]
            points[name].append((unlabeled if size is None else size, float(np.mean(shares)),
                                 float(np.std(shares, ddof=1)) if len(shares) > 1 else 0.0))
    return points


def transfer_section(work: WorkDir, split: str, teacher: dict, strategies: Sequence[str],
                     seeds: Optional[Sequence[int]], sizes: Sequence[int]) -> List[str]:
    """The report's transfer-set size section; writes its plot (CURVE_PLOT) beside the report."""
    unlabeled = len(pipeline.load_data(work)["transfer"])
    curve = transfer_results(work, strategies, seeds, sizes)
    if reference := _summary_f1(teacher):
        plot_transfer_curve(curve_points(split, teacher, curve, unlabeled), work.path(CURVE_PLOT))
    return [f"## Transfer-set size (Table 3 over transfer data): {split} F1 (%)", "",
            "Each strategy's student trained on every labeled sentence and N evenly spaced of the "
            f"{unlabeled:,} unlabeled transfer sentences (--transfer_sizes; the same teacher and cache), its F1 "
            "(the mean across languages, or F1" + (", mean ± std over the seeds" if seeds and len(seeds) > 1 else "")
            + ") and its share of the teacher's. A strategy that reads no transfer text has one student for "
            "every size." + (f" The shares are plotted in `{CURVE_PLOT}`." if reference else ""), "",
            *transfer_table(split, teacher, curve, unlabeled),
            *(["", f"![student F1 / teacher F1 against unlabeled transfer sentences]({CURVE_PLOT})"]
              if reference else [])]


def ablation_report(work: WorkDir, strategies: Sequence[str], seeds: Optional[Sequence[int]] = None,
                    sizes: Sequence[int] = ()) -> str:
    teacher_scores, argmax_scores, results = _load_results(work, strategies, seeds)
    split = _split(teacher_scores)
    lines = ["# Distillation strategy ablation", "", f"Work dir: `{work.root}`", "",
             *table3(teacher_scores, results, argmax_scores)]
    if seeds is not None:
        lines += ["", *seeds_section(split, seeds, results)]
    if sizes:
        lines += ["", *transfer_section(work, split, teacher_scores[split], strategies, seeds, sizes)]
    lines += ["", f"## Table 3's ordering, seed by seed: {split} F1 (%)", "",
              "The paper's D4.2 ≥ D4.1 ≥ D3.2 > D3.1 and D1 > D0-S, for each pair of those strategies that was run: "
              "whether the first one's F1 (the mean across languages, or F1) reached the second one's.", "",
              *ordering_table(split, seeds or [None], results),
              "", "## Stages (Table 4): dev F1 (%) after each stage and unfrozen layer", "",
              "Dev F1 of the stage's tagger (softmax head, or the logit head in a logits-only stage) "
              "after each step, with the step's best weights restored, its word tags decoded as the student's "
              "scores are (so a strategy's last step gives its dev F1; students of versions before that recorded "
              "argmax decoding here); a representation-only stage has no tagger (–). Best epoch 0: no epoch beat "
              "the step's starting weights."]
    for name, infos in results.items():
        lines += ["", f"### {name}: {get_strategy(name).description}"]
        for seed, info in zip(seeds or [None], infos):
            run = "" if seed is None else f"seed {seed}"
            if "per_language" in info:
                for lang, record in info["per_language"].items():
                    lines += ["", f"{run + ', ' if run else ''}{lang} student:", "", *table4(record["history"])]
            else:
                lines += [*(["", f"{run}:"] if run else []), "", *table4(info["history"])]
    return "\n".join(lines) + "\n"
