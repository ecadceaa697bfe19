"""Run one tiny training loop in a fresh process, for the resume and distribution tests.

    python tests/training_driver.py spec.json

spec.json: {"loop": "staged" | "multigrained" | "nas" | "subwords" | "teacher" | "sequence_teacher", "out": result .npz path,
            "checkpoint_dir": dir or null, "kill_at": [epoch, batch] or null,
            "distribution": "none" | "mirrored" | "multi_worker", "logical_cpus": n (0: leave the CPU alone),
            "epochs": n}
The result holds the final weights (`w0`, `w1`, ...) and `record` (a JSON string: per-epoch train
losses of this process, the loop's history, dev metrics). `kill_at` = [e, b]: the process SIGKILLs
itself after batch b of the loop's e-th epoch (1-based, counted over the whole run, epochs of
earlier killed processes that the checkpoint holds included; b = 0: as epoch e begins, before any
batch), standing in for a machine lost mid-run. Under multi_worker TF_CONFIG
comes from the environment.
"""
import json
import os
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["HF_HUB_OFFLINE"] = "1"
import xtremedistil_tf  # noqa: E402,F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SPEC = json.loads(Path(sys.argv[1]).read_text())
if SPEC.get("logical_cpus"):
    # Before TensorFlow initialises its devices: two logical CPUs for MirroredStrategy.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * SPEC["logical_cpus"])

from conftest import TOY_LABELS, toy_ner_sentences, toy_texts, write_tiny_vocab  # noqa: E402
from xtremedistil_tf.data.alignment import TagVocab, encode  # noqa: E402
from xtremedistil_tf.engine.distribute import make_distribution  # noqa: E402
from xtremedistil_tf.engine.resume import EpochCheckpoint, stateful_dropout  # noqa: E402
from transformers import BertConfig, BertTokenizerFast, TFBertModel  # noqa: E402
from xtremedistil_tf.students import build_bilstm_student  # noqa: E402
from xtremedistil_tf.methods.staged import DistilConfig, make_dev_f1, train_student  # noqa: E402
from xtremedistil_tf.students.crf_student import build_bilstm_crf_student, student_crf_constraints  # noqa: E402
from xtremedistil_tf.methods import multigrained as mg  # noqa: E402
from xtremedistil_tf.methods.nas.distil import NasDistilConfig, Distiller, build_student  # noqa: E402
from xtremedistil_tf.methods.nas.space import Arch  # noqa: E402
from subwords_helpers import corpus, tokenizer_pair  # noqa: E402
from xtremedistil_tf.methods.subwords import dual  # noqa: E402
from xtremedistil_tf.methods.subwords.train import DistilLMConfig, DualTrainer, train  # noqa: E402
from xtremedistil_tf.methods.subwords.vocab import load_vocab_tokenizer  # noqa: E402
from xtremedistil_tf.teachers.finetune import FinetuneConfig, finetune  # noqa: E402
from xtremedistil_tf.teachers.model import build_teacher, initialise_head  # noqa: E402
from xtremedistil_tf.data.sentence import Sentence  # noqa: E402
from xtremedistil_tf.teachers.classifier import build_sequence_teacher, finetune_sequence_teacher  # noqa: E402
from xtremedistil_tf.engine.distribute import scope_of  # noqa: E402
from xtremedistil_tf.methods.subwords.models import DualTeacher, student_config  # noqa: E402
from xtremedistil_tf.methods.subwords.models import build_student as build_lm_student  # noqa: E402

MAX_LEN = 16
INITIAL = []  # the student's starting weights
TEACHER_HIDDEN = 8


class Killer(tf.keras.callbacks.Callback):
    """Counts epochs and batches over every fit of the loop; SIGKILLs the process at `kill_at`."""

    def __init__(self, kill_at):
        super().__init__()
        self.kill_at = tuple(kill_at) if kill_at else None
        self.epoch = 0
        self.losses = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch += 1
        self._maybe_kill(0)

    def on_train_batch_end(self, batch, logs=None):
        self._maybe_kill(batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))

    def _maybe_kill(self, batch):
        if self.kill_at == (self.epoch, batch):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def tokenizer():
    directory = write_tiny_vocab(Path(SPEC["out"]).parent / "vocab")
    return BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)


def teacher_outputs(windows, num_tags, seed):
    rng = np.random.default_rng(seed)
    code = np.random.default_rng(0).normal(size=(num_tags, TEACHER_HIDDEN)).astype(np.float32)
    onehot = np.eye(num_tags, dtype=np.float32)[windows.label_ids]
    logits = 6.0 * onehot - 3.0 + 0.3 * rng.normal(size=onehot.shape).astype(np.float32)
    hidden = onehot @ code + 0.1 * rng.normal(size=onehot.shape[:2] + (TEACHER_HIDDEN,)).astype(np.float32)
    return {"input_ids": windows.input_ids, "attention_mask": windows.attention_mask, "label_ids": windows.label_ids,
            "logits": logits, "hidden": hidden}


def per_epoch(arrays, batch_size):
    """A per-epoch source: seed -> the examples shuffled in the order that seed gives, batched."""
    examples = tf.data.Dataset.from_tensor_slices(arrays)
    n = len(arrays["input_ids"])
    return lambda seed: examples.shuffle(n, seed=seed, reshuffle_each_iteration=False).batch(batch_size)


def run_staged(distribution, checkpoint, killer):
    tok, vocab = tokenizer(), TagVocab(TOY_LABELS)
    splits = {"train": toy_ner_sentences(16, seed=11), "transfer": toy_ner_sentences(48, seed=12),
              "dev": toy_ner_sentences(16, seed=13)}
    windows = {name: encode(s, tok, vocab, MAX_LEN) for name, s in splits.items()}
    data = {name: teacher_outputs(w, len(vocab), i) for i, (name, w) in enumerate(windows.items())}
    data["transfer"]["label_ids"] = np.full_like(data["transfer"]["label_ids"], vocab.pad_id)
    tf.keras.utils.set_random_seed(0)
    with stateful_dropout(), scope(distribution):
        student = build_bilstm_student(len(tok), len(vocab), embedding_dim=8, hidden=8, teacher_hidden=TEACHER_HIDDEN,
                                       dropout=SPEC.get("dropout", 0.2))
    INITIAL.extend(student.get_weights())
    config = DistilConfig(pad_id=vocab.pad_id, epochs_per_layer=SPEC.get("epochs", 2), patience=None,
                          learning_rate=2e-2, run_eagerly=SPEC.get("eager", True), seed=3)
    dev = tf.data.Dataset.from_tensor_slices(data["dev"]).batch(8)
    position = checkpoint.position()
    if position:  # epochs the checkpoint holds
        killer.epoch = sum(len(s["val_losses"]) for s in position["history"]) + \
            len((position["step"] or {}).get("values", []))
    history = train_student(SPEC.get("strategy", "D4.2"), student, per_epoch(data["train"], 8),
                            per_epoch(data["transfer"], 8), dev, config, callbacks=[killer],
                            evaluate_fn=make_dev_f1(windows["dev"], [s.tags for s in splits["dev"]], vocab),
                            checkpoint=checkpoint, distribution=distribution)
    return student.get_weights(), {"history": history.to_dict()}


def multigrained_stream(vocab, windows, seed):
    """A made-up multi-grained cache: teacher logits, and as its 2-best paths the gold one twice
    (always a path the CRF's constraints allow) with probabilities 0.7 and 0.2."""
    data = teacher_outputs(windows, len(vocab), seed)
    del data["hidden"]
    second = windows.label_ids.copy()
    data["kbest_tags"] = np.stack([windows.label_ids, second], axis=1).astype(np.int32)
    data["kbest_probs"] = np.tile(np.array([0.7, 0.2], np.float32), (len(second), 1))
    data["kbest_valid"] = np.ones((len(second), 2), np.float32)
    return tf.data.Dataset.from_tensor_slices(data)


def run_multigrained(distribution, checkpoint, killer):
    tok, vocab = tokenizer(), TagVocab(TOY_LABELS)
    train = encode(toy_ner_sentences(32, seed=21), tok, vocab, MAX_LEN)
    dev = encode(toy_ner_sentences(16, seed=22), tok, vocab, MAX_LEN)
    tf.keras.utils.set_random_seed(0)
    with stateful_dropout(), scope(distribution):
        student = build_bilstm_crf_student(len(tok), len(vocab), student_crf_constraints(vocab, "IOB2"),
                                           embedding_dim=8, hidden=8, dropout=SPEC.get("dropout", 0.2))
    INITIAL.extend(student.get_weights())
    config = mg.MultiGrainedConfig(losses=("hard", "seq_ce", "token_em"), kbest=2, epochs=SPEC.get("epochs", 4),
                                   batch_size=8, learning_rate=1e-2, patience=None, seed=5,
                                   run_eagerly=SPEC.get("eager", True))
    position = checkpoint.position()
    killer.epoch = len(position["epochs"]) if position else 0
    # Epochs selected by the dev NLL of the gold tags (the tiny student's dev F1 stays 0 for a few
    # epochs, which would restore the starting weights and make the weight comparisons vacuous).
    history = mg.train_multigrained(student, multigrained_stream(vocab, train, 1), mg.windows_dataset(dev), config,
                                    vocab.pad_id, checkpoint=checkpoint, distribution=distribution, callbacks=[killer])
    return student.get_weights(), {"history": history.to_dict()}


def run_nas(distribution, checkpoint, killer):
    """KD-NAS distillation (hs+minilm) of a 1-layer BERT student from a random 2-layer teacher."""
    tf.keras.utils.set_random_seed(0)
    with scope(distribution):
        teacher = TFBertModel(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=32, initializer_range=0.2))
        teacher.build_in_name_scope()
    rng = np.random.default_rng(7)
    encoded = [rng.integers(5, 40, size=int(rng.integers(3, 12))).astype(np.int32) for _ in range(40)]
    config = NasDistilConfig(objective="hs+minilm", relation_heads=2, epochs=SPEC.get("epochs", 4), batch_size=8,
                           learning_rate=3e-3, seed=9, eager=SPEC.get("eager", True))
    with stateful_dropout(), scope(distribution):
        student = build_student(Arch(1, 2, 16, 32, "gelu"), teacher.config.to_dict(), seed=1)
    INITIAL.extend(student.get_weights())
    position = checkpoint.position()
    killer.epoch = len(position["epochs"]) if position else 0
    history = Distiller(teacher, student, config).train(encoded, progress=False, checkpoint=checkpoint,
                                                        distribution=distribution, callbacks=[killer])
    return student.get_weights(), {"history": {"train_loss": history}}


def run_subwords(distribution, checkpoint, killer):
    """DualTrain+SharedProjUp (every term) on tiny BERTs, an engine epoch every 3 steps."""

    # Learned once for every run of a test: the vocabulary trainer's ties fall differently by process.
    vocabs = Path(SPEC["out"]).parent / "subword_vocabs"
    if not vocabs.exists():
        tokenizer_pair(vocabs)
    student_tok, teacher_tok = (load_vocab_tokenizer(vocabs / name) for name in ("student", "teacher"))
    sentences = dual.dual_corpus(student_tok, teacher_tok, corpus(48, seed=3))
    cfg = DistilLMConfig(variant="DualTrain+SharedProjUp", batch_size=8, steps=SPEC.get("epochs", 4) * 3,
                          warmup_fraction=0.0, learning_rate=1e-2, seed=5)
    with stateful_dropout(), scope(distribution):
        student = build_lm_student(student_config(60, 16, 2, 2, max_position=64, dropout=SPEC.get("dropout", 0.1)), seed=1)
        teacher = build_lm_student(student_config(200, 32, 2, 2, max_position=64, dropout=SPEC.get("dropout", 0.1)), seed=2)
        trainer = DualTrainer(student, DualTeacher(teacher, 16, 60, seed=3), cfg, run_eagerly=SPEC.get("eager", True))
    INITIAL.extend(student.get_weights())
    position = checkpoint.position()
    killer.epoch = len(position["epochs"]) if position else 0
    history = train(trainer, sentences, dual.Specials.of(student_tok), dual.Specials.of(teacher_tok), progress=False,
                    log_every=3, checkpoint=checkpoint, distribution=distribution, callbacks=[killer])
    return student.get_weights() + teacher.get_weights(), {"history": history}


def tiny_bert_dir() -> Path:
    """A tiny BERT config (2 layers, hidden 32) and vocabulary, written once per test dir."""
    directory = Path(SPEC["out"]).parent / "teacher_init"
    if not directory.exists():
        write_tiny_vocab(directory)
        BertConfig(vocab_size=len((directory / "vocab.txt").read_text().split()), hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=32).save_pretrained(directory)
    return directory


def run_teacher(distribution, checkpoint, killer):
    """Token teacher fine-tuning (teachers/finetune.py, first-piece supervision, dropout on) of a
    randomly initialised tiny BERT."""
    directory = tiny_bert_dir()
    tf.keras.utils.set_random_seed(0)
    with stateful_dropout(), scope(distribution):
        teacher, tok = build_teacher(str(directory), TOY_LABELS, max_seq_length=MAX_LEN,
                                     dropout=SPEC.get("dropout", 0.1), random_init=True)
        initialise_head(teacher, "glorot")
    INITIAL.extend(teacher.get_weights())
    config = FinetuneConfig(epochs=SPEC.get("epochs", 3), batch_size=8, learning_rate=1e-3, patience=3, seed=5,
                            progress=False)
    position = checkpoint.position()
    killer.epoch = len(position["epochs"]) if position else 0
    result = finetune(teacher, tok, toy_ner_sentences(48, seed=31), toy_ner_sentences(16, seed=32), "IOB2", config,
                      checkpoint=checkpoint, distribution=distribution, callbacks=[killer])
    return teacher.get_weights(), {"history": result.history, "best_epoch": result.best_epoch}


def run_sequence_teacher(distribution, checkpoint, killer):
    """Sentence-classification teacher fine-tuning (teachers/classifier.py, dropout on) of a randomly
    initialised tiny BERT on conftest's toy texts."""
    def texts(n, seed):
        return [Sentence(text.split(), None, None, label)
                for label, text in (line.split("\t") for line in toy_texts(n, seed))]

    directory = tiny_bert_dir()
    tf.keras.utils.set_random_seed(0)
    with stateful_dropout(), scope(distribution):
        teacher, tok = build_sequence_teacher(str(directory), ["none", "people", "places"], max_seq_length=MAX_LEN,
                                              dropout=SPEC.get("dropout", 0.1), random_init=True)
        initialise_head(teacher, "glorot")
    INITIAL.extend(teacher.get_weights())
    config = FinetuneConfig(epochs=SPEC.get("epochs", 3), batch_size=8, learning_rate=SPEC.get("learning_rate", 1e-3),
                            patience=3, seed=SPEC.get("seed", 5), progress=False)
    position = checkpoint.position()
    killer.epoch = len(position["epochs"]) if position else 0
    result = finetune_sequence_teacher(teacher, tok, texts(48, 41), texts(16, 42), config, checkpoint=checkpoint,
                                       distribution=distribution, callbacks=[killer])
    return teacher.get_weights(), {"history": result.history, "best_epoch": result.best_epoch}


def scope(distribution):
    return scope_of(distribution)


def main():
    distribution = make_distribution(SPEC.get("distribution", "none"))
    if distribution is not None:
        print(f"replicas={distribution.num_replicas_in_sync}", flush=True)
    checkpoint = EpochCheckpoint(SPEC.get("checkpoint_dir"))
    killer = Killer(SPEC.get("kill_at"))
    loops = {"staged": run_staged, "multigrained": run_multigrained, "nas": run_nas, "subwords": run_subwords,
             "teacher": run_teacher, "sequence_teacher": run_sequence_teacher}
    weights, record = loops[SPEC["loop"]](distribution, checkpoint, killer)
    record["epoch_losses"] = killer.losses
    record["max_change"] = max(float(np.abs(w - w0).max()) for w, w0 in zip(weights, INITIAL))
    out = SPEC["out"]
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index", 0):
        out = f"{out}.worker{task['index']}.npz"
    np.savez(out, record=json.dumps(record), **{f"w{i}": w for i, w in enumerate(weights)})


if __name__ == "__main__":
    main()
