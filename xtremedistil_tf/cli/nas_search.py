"""bin/nas_search: KD-NAS over a BERT-family teacher and unlabeled text (docs/nas.md).

    # the search (latency table, episodes, random baselines, report); rerun to resume
    bin/nas_search --teacher=minilm --wikiann_dir=/work/shared/data/wikiann --langs=en --work_dir=runs/nas
    # distil the best architecture found on the full text, saved for bin/train --teacher=<dir>
    bin/nas_search --mode=distil --arch=best --work_dir=runs/nas --wikiann_dir=... --langs=en
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
import tensorflow as tf
from absl import flags

from xtremedistil_tf.cli.common import command, define_common_flags, define_execution_flags, int_list, log_to_work_dir
from xtremedistil_tf.engine.distribute import is_chief, make_distribution, scope_of, worker_work_dir
from xtremedistil_tf.engine.precision import precision_policy
from xtremedistil_tf.engine.resume import EpochCheckpoint, stateful_dropout
from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_write_json, read_json
from xtremedistil_tf.losses.hidden import MAPPINGS
from xtremedistil_tf.methods.nas.controller import ControllerConfig
from xtremedistil_tf.methods.nas.distil import (
    OBJECTIVES,
    NasDistilConfig,
    Distiller,
    build_student,
    describe,
    distil_arch,
    encode_texts,
    load_teacher,
    read_texts,
    save_student,
    split_texts,
)
from xtremedistil_tf.methods.nas.latency import LatencyTable, build_latency_table
from xtremedistil_tf.methods.nas.report import plot_loss_latency, write_report
from xtremedistil_tf.methods.nas.reward import reward
from xtremedistil_tf.methods.nas.search import SearchConfig, run_search, top_records
from xtremedistil_tf.methods.nas.space import Arch, SearchSpace
from xtremedistil_tf.run.workdir import fingerprint_hash

FLAGS = flags.FLAGS
log = logging.getLogger("nas_search")

flags.DEFINE_enum("mode", "search", ["search", "latency", "distil", "distill"],
                  "search: latency table + search + random baselines + report; latency: only the table; "
                  "distil: distil --arch on the full text and save it for the NER pipeline (`distill`: the old spelling, "
                  "deprecated).")
# Data and teacher
flags.DEFINE_string("teacher", "minilm", "BERT-family teacher: a local dir, hub name or 'minilm' (PyPI all-MiniLM-L6-v2).")
flags.DEFINE_string("text_file", "", "Unlabeled text, one sentence per line.")
flags.DEFINE_string("wikiann_dir", "", "WikiAnn root (<dir>/<lang>/train); its sentences are used without tags.")
flags.DEFINE_list("langs", ["en"], "WikiAnn languages.")
flags.DEFINE_integer("max_seq_length", NasDistilConfig.max_seq_length, "Word pieces per sentence (longer ones are truncated).")
flags.DEFINE_integer("eval_sentences", 500, "Held-out sentences the distillation loss is measured on.")
flags.DEFINE_integer("seed", SearchConfig.seed, "Seed of the data split, the students' init and the search.")
# Search space
flags.DEFINE_list("layers", ["3", "4", "6", "10", "12"], "Candidate layer counts (Table 1).")
flags.DEFINE_list("heads", ["2", "3", "4", "6", "12"], "Candidate attention-head counts (Table 1).")
flags.DEFINE_list("hidden", ["288", "384", "576", "768"], "Candidate hidden sizes (Table 1's 2400 states; see docs/nas.md).")
flags.DEFINE_list("intermediate", ["384", "512", "576", "768", "1024", "1536", "2048", "3072"], "Candidate FFN sizes (Table 1).")
flags.DEFINE_list("activations", ["gelu", "relu", "silu"], "Candidate activations (Table 1).")
flags.DEFINE_bool("allow_deeper_students", False, "Keep students deeper than the teacher in the space (their "
                  "lower layers then share teacher layer 1 under the Last mapping).")
# Distillation
flags.DEFINE_enum("objective", NasDistilConfig.objective, list(OBJECTIVES), "Distillation loss (the reward's loss is "
                  "always the objective's total on the held-out sentences).")
flags.DEFINE_enum("mapping", NasDistilConfig.mapping, list(MAPPINGS), "Hidden-state layer mapping.")
flags.DEFINE_enum("hs_reduction", NasDistilConfig.hs_reduction, ["mean", "sum"], "Hidden-state loss over mapped pairs: mean (default, "
                  "keeps 1 - loss positive for every depth) or sum (Eq. 1).")
flags.DEFINE_integer("relation_heads", NasDistilConfig.relation_heads, "MiniLMv2 relation heads (must divide both hidden sizes).")
flags.DEFINE_integer("relation_teacher_layer", NasDistilConfig.relation_teacher_layer, "MiniLMv2 teacher layer (0: second-last).")
flags.DEFINE_integer("batch_size", NasDistilConfig.batch_size, "Distillation batch size.")
flags.DEFINE_float("learning_rate", NasDistilConfig.learning_rate, "Peak AdamW learning rate of distillation.")
flags.DEFINE_integer("proxy_sentences", 2000, "Proxy set: sentences each candidate is distilled on.")
flags.DEFINE_integer("proxy_epochs", 1, "Proxy set: epochs per candidate (paper: 4 on 30%).")
flags.DEFINE_bool("proxy_eager", True, "Proxy distillation without tf.function: tracing teacher and student "
                  "costs more than a proxy of a few dozen steps.")
flags.DEFINE_integer("distil_sentences", 0, "--mode=distil: training sentences (0: all but the held-out ones).")
flags.DEFINE_integer("distil_epochs", 3, "--mode=distil: epochs.")
# The old spellings (the project writes "distil"), deprecated: accepted with a warning.
flags.DEFINE_alias("distill_sentences", "distil_sentences")
flags.DEFINE_alias("distill_epochs", "distil_epochs")
flags.DEFINE_string("arch", "best", "--mode=distil: 'best', 'top:N' (Nth best of the search) or "
                    "'layers,heads,hidden,intermediate,activation'.")
flags.DEFINE_string("output_dir", "", "--mode=distil: where the student goes (default <work_dir>/students/<arch>).")
# Reward and latency
flags.DEFINE_float("alpha", -0.06, "Reward latency exponent.")
flags.DEFINE_float("beta", 0.6, "Target latency as a fraction of the teacher's.")
flags.DEFINE_string("latency_table", "", "Latency lookup table JSON (default <work_dir>/latency_table.json); "
                    "built once, resumed if interrupted.")
flags.DEFINE_integer("latency_runs", 5, "Timed runs per sentence length (the fastest counts).")
flags.DEFINE_list("latency_lengths", [], "Sentence lengths in word pieces to time (default: the 10/30/50/70/90th "
                  "percentiles of the held-out sentences).")
flags.DEFINE_integer("latency_verify", 6, "Full models timed to check the additive latency model.")
flags.DEFINE_integer("num_threads", 1, "TensorFlow intra-op threads (latency is measured on one core by default).")
# Search
flags.DEFINE_integer("episodes", SearchConfig.episodes, "Episodes M.")
flags.DEFINE_integer("candidates", SearchConfig.candidates, "Candidates N per episode.")
flags.DEFINE_float("epsilon_start", SearchConfig.epsilon_start, "Exploration ratio of episode 1.")
flags.DEFINE_float("epsilon_min", SearchConfig.epsilon_min, "Lowest exploration ratio.")
flags.DEFINE_float("epsilon_decay", SearchConfig.epsilon_decay, "Exploration ratio decrease per episode.")
flags.DEFINE_integer("controller_units", ControllerConfig.units, "Controller LSTM cells.")
flags.DEFINE_float("controller_learning_rate", ControllerConfig.learning_rate, "Controller RMSProp learning rate.")
flags.DEFINE_integer("controller_epochs", ControllerConfig.epochs, "Controller epochs per episode.")
flags.DEFINE_integer("top_k", 3, "Architectures listed as the search's result.")
flags.DEFINE_integer("random_baselines", 3, "Random architectures per seed distilled on the same proxy (Table 3).")
flags.DEFINE_list("random_seeds", ["1"], "Seeds of the random baselines.")
define_common_flags()
define_execution_flags("--mode=distil's distillation (the search's proxy runs use one device)")


def search_space(num_teacher_layers: int):
    space = SearchSpace(*(tuple(int_list(name)) for name in ("layers", "heads", "hidden", "intermediate")),
                        tuple(FLAGS.activations))
    return space if FLAGS.allow_deeper_students else space.restricted_to_depth(num_teacher_layers)


def distil_config(epochs: int, eager: bool = False):
    return NasDistilConfig(eager=eager, objective=FLAGS.objective, mapping=FLAGS.mapping, hs_reduction=FLAGS.hs_reduction,
                         relation_heads=FLAGS.relation_heads, relation_teacher_layer=FLAGS.relation_teacher_layer,
                         epochs=epochs, batch_size=FLAGS.batch_size, learning_rate=FLAGS.learning_rate,
                         max_seq_length=FLAGS.max_seq_length, seed=FLAGS.seed)


class Context:
    """Teacher, text and latency table shared by the modes."""

    def __init__(self, train_sentences: int):
        self.work = Path(FLAGS.work_dir)
        self.teacher, self.tokenizer, self.teacher_config = load_teacher(FLAGS.teacher)
        texts = read_texts(FLAGS.text_file, FLAGS.wikiann_dir, FLAGS.langs)
        train, evaluation = split_texts(texts, train_sentences, FLAGS.eval_sentences, FLAGS.seed)
        self.train_ids = encode_texts(self.tokenizer, train, FLAGS.max_seq_length)
        self.eval_ids = encode_texts(self.tokenizer, evaluation, FLAGS.max_seq_length)
        self.space = search_space(self.teacher.config.num_hidden_layers)
        log.info("%d training / %d held-out sentences; %d states in the space", len(train), len(evaluation),
                 len(self.space.states))

    def latency_lengths(self) -> list:
        if FLAGS.latency_lengths:
            return int_list("latency_lengths")
        lengths = [len(ids) for ids in self.eval_ids]
        return sorted({int(round(np.percentile(lengths, q))) for q in (10, 30, 50, 70, 90)})

    def latency_table_path(self) -> Path:
        return Path(FLAGS.latency_table or self.work / "latency_table.json")

    def existing_latency_table(self):
        """The finished table when there is one (distil mode only reports latency), else None."""
        path = self.latency_table_path()
        try:
            return LatencyTable.load(path) if path.exists() else None
        except ConfigError:
            return None

    def latency_table(self):
        path = self.latency_table_path()
        rng = np.random.default_rng(FLAGS.seed)
        states = self.space.states
        verify = [states[i] for i in rng.choice(len(states), size=min(FLAGS.latency_verify, len(states)), replace=False)]
        return build_latency_table(path, self.space, self.teacher_config, self.latency_lengths(), FLAGS.latency_runs,
                                   verify=verify, progress=not FLAGS.no_progress)


def make_evaluator(ctx: Context, table):
    """Proxy mini-KD of one architecture -> {"loss", "latency_ms", "reward", "parameters", "train_loss"}."""
    config = distil_config(FLAGS.proxy_epochs, FLAGS.proxy_eager)

    def evaluate(arch) -> dict:
        student, result = distil_arch(arch, ctx.teacher, ctx.teacher_config, ctx.train_ids, ctx.eval_ids, config,
                                      progress=not FLAGS.no_progress)
        loss = result["eval"]["total"]
        latency = table.latency(arch)
        out = {"loss": loss, "latency_ms": latency, "reward": reward(loss, latency, table.teacher_ms, FLAGS.alpha, FLAGS.beta),
               "parameters": describe(arch, student)["parameters"], "train_loss": result["train_loss"][-1],
               "eval_losses": result["eval"]}
        log.info("%s: loss %.4f, latency %.2f ms, reward %.4f", arch.key, loss, latency, out["reward"])
        return out

    return evaluate


def random_baselines(ctx: Context, evaluate) -> list:
    """--random_baselines architectures per --random_seeds, proxy-distilled; cached in baselines.json."""
    path = ctx.work / "baselines.json"
    done = read_json(path) if path.exists() else []
    states = ctx.space.states
    for seed in (int(s) for s in FLAGS.random_seeds):
        rng = np.random.default_rng([seed, 7919])
        for index in rng.choice(len(states), size=min(FLAGS.random_baselines, len(states)), replace=False):
            arch = states[index]
            if any(b["seed"] == seed and b["arch"] == arch.key for b in done):
                continue
            done.append({"seed": seed, "arch": arch.key, **evaluate(arch)})
            atomic_write_json(path, done)
    return done


def run_search_mode() -> None:
    ctx = Context(FLAGS.proxy_sentences)
    table = ctx.latency_table()
    log.info("teacher latency %.2f ms; latency model error %s", table.teacher_ms, table.verification_error())
    if FLAGS.mode == "latency":
        return
    evaluate = make_evaluator(ctx, table)
    settings = {"teacher": FLAGS.teacher, "data": [FLAGS.text_file, FLAGS.wikiann_dir, list(FLAGS.langs)],
                "proxy_sentences": FLAGS.proxy_sentences, "eval_sentences": FLAGS.eval_sentences,
                "max_seq_length": FLAGS.max_seq_length,
                # The key keeps its old spelling: it is part of work dirs' fingerprints on disk.
                "distill": asdict(distil_config(FLAGS.proxy_epochs, FLAGS.proxy_eager)),
                "alpha": FLAGS.alpha, "beta": FLAGS.beta, "teacher_latency_ms": table.teacher_ms}
    search = SearchConfig(FLAGS.episodes, FLAGS.candidates, FLAGS.epsilon_start, FLAGS.epsilon_min,
                          FLAGS.epsilon_decay, FLAGS.seed)
    controller = ControllerConfig(units=FLAGS.controller_units, learning_rate=FLAGS.controller_learning_rate,
                                  epochs=FLAGS.controller_epochs, seed=FLAGS.seed)
    records = run_search(ctx.space, evaluate, search, controller, ctx.work, settings, progress=not FLAGS.no_progress)
    top = top_records(records, FLAGS.top_k)
    baselines = random_baselines(ctx, evaluate) if FLAGS.random_baselines else []
    atomic_write_json(ctx.work / "top_architectures.json", top)
    header = {"teacher": FLAGS.teacher, "teacher CPU latency (ms)": f"{table.teacher_ms:.2f}",
              "states in the space": len(ctx.space.states), "episodes x candidates": f"{search.episodes} x {search.candidates}",
              "proxy": f"{FLAGS.proxy_epochs} epoch(s) on {len(ctx.train_ids)} sentences, loss on {len(ctx.eval_ids)} held-out",
              "objective": f"{FLAGS.objective}, mapping {FLAGS.mapping}, reduction {FLAGS.hs_reduction}",
              "reward": f"(1 - loss) * (latency / ({FLAGS.beta} * teacher latency)) ^ {FLAGS.alpha}",
              "epsilon": f"{FLAGS.epsilon_start} - {FLAGS.epsilon_decay}/episode, min {FLAGS.epsilon_min}"}
    plot_loss_latency(ctx.work / "loss_latency.png", records, top, baselines)
    write_report(ctx.work / "report.md", records, top, baselines, header, table.verification_error(), "loss_latency.png")
    print(f"top architectures: {', '.join(r['arch'] for r in top)}; report: {ctx.work / 'report.md'}")


def chosen_arch(work: Path):
    spec = FLAGS.arch
    if spec == "best" or spec.startswith("top:"):
        rank = 1 if spec == "best" else int(spec.split(":", 1)[1])
        state_file = work / "search_state.json"
        if not state_file.exists():
            raise ConfigError(f"--arch={spec} needs a search in {work} (no search_state.json); run --mode=search first")
        records = read_json(state_file)["records"]
        if len(records) < rank:
            raise ConfigError(f"--arch={spec}: the search in {work} explored only {len(records)} states")
        return Arch.from_key(top_records(records, rank)[-1]["arch"])
    return Arch.from_key(spec)


def run_distil_mode() -> None:
    distribution = make_distribution(FLAGS.distribution)
    work = Path(worker_work_dir(FLAGS.work_dir, distribution))
    arch = chosen_arch(Path(FLAGS.work_dir))
    config = distil_config(FLAGS.distil_epochs)
    with precision_policy(FLAGS.mixed_precision):
        with scope_of(distribution), stateful_dropout():
            ctx = Context(FLAGS.distil_sentences)
            student = build_student(arch, ctx.teacher_config, config.seed)
        distiller = Distiller(ctx.teacher, student, config)
        # A rerun of the same command after a kill continues from the last epoch's checkpoint.
        fingerprint = {"arch": arch.key, "teacher": FLAGS.teacher, "config": asdict(config),
                       "train": len(ctx.train_ids)}
        checkpoint = EpochCheckpoint(work / "checkpoints" / f"distill-{fingerprint_hash(fingerprint)}")  # on-disk name of older runs
        history = distiller.train(ctx.train_ids, progress=not FLAGS.no_progress, desc=f"distil {arch.key}",
                                  checkpoint=checkpoint, distribution=distribution)
        scores = distiller.evaluate(ctx.eval_ids)
    table = ctx.existing_latency_table()  # read last: a search may be building it meanwhile
    info = {**describe(arch, student), "teacher": FLAGS.teacher, "train_sentences": len(ctx.train_ids),
            "eval_sentences": len(ctx.eval_ids), "config": asdict(config), "train_loss": history,
            "eval": scores, "latency_ms": table.latency(arch) if table else None,
            "teacher_latency_ms": table.teacher_ms if table else None}
    chief_dir = FLAGS.output_dir if is_chief(distribution) else ""
    output = Path(chief_dir or work / "students" / arch.key.replace(",", "_"))
    save_student(student, ctx.tokenizer, output, info)
    checkpoint.clear()
    print(f"{arch.key}: held-out loss {scores['total']:.4f}, latency {info['latency_ms']} ms; saved to {output}")


def nas_search() -> None:
    if not FLAGS.work_dir:
        raise ConfigError("--work_dir is required")
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.num_threads)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.num_threads)
    log_to_work_dir(FLAGS.work_dir)
    old = [f"--{name}" for name in ("distill_sentences", "distill_epochs") if FLAGS[name].present]
    old += ["--mode=distill"] if FLAGS.mode == "distill" else []
    if old:
        log.warning("%s: the old spelling, deprecated; write %s", ", ".join(old),
                    ", ".join(o.replace("distill", "distil") for o in old))
    run_distil_mode() if FLAGS.mode in ("distil", "distill") else run_search_mode()


main, run = command(nas_search, __doc__, 'bin/nas_search --mode=search --work_dir=runs/nas')
