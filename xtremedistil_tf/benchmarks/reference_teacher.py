"""The reference teacher: a plain Keras fine-tuning loop written the way the field writes one,
to stand beside the pipeline's teacher in `bin/benchmark teacher`.

It shares no code with the package on purpose (TensorFlow, `transformers`, seqeval and NumPy
only): a number from the pipeline proves little until an independent implementation reaches it
on the same data and budget. The recipe is Hugging Face's token-classification example:

- encoder (TFAutoModel) -> Dropout(0.1) -> Dense over the word labels (Glorot uniform);
- the loss on the first piece of each word only (other pieces are -100 and ignored);
- AdamW (weight decay 0.01) at the encoder's rate for every weight, decayed linearly to 0, no
  warm-up; the weights after the last epoch are kept (no selection);
- sentences longer than `max_seq_length` pieces are truncated (their cut words score as O);
  batches are padded to their longest row (what DataCollatorForTokenClassification does).

Input: the pipeline's data snapshot (`<work_dir>/data/{train,dev,test}.jsonl`), so both read the
same sentences.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf
from seqeval.metrics import f1_score
from transformers import AutoTokenizer, TFAutoModel

IGNORE = -100


def read_split(path) -> List[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def to_iob2(tags: Sequence[str]) -> List[str]:
    """IOB1, IOB2, BIOES and BMES tags as IOB2, so seqeval's default rules score any scheme."""
    out, previous = [], "O"
    for tag in tags:
        if tag == "O" or "-" not in tag:
            out.append("O")
            previous = "O"
            continue
        prefix, kind = tag.split("-", 1)
        inside = prefix in ("I", "M", "E")
        continues = previous != "O" and previous.split("-", 1)[1] == kind
        out.append(f"I-{kind}" if inside and continues else f"B-{kind}")
        previous = out[-1]
    return out


def encode(sentences: List[dict], tokenizer, label_ids: Dict[str, int], max_length: int):
    """input_ids, attention_mask and labels (first pieces; -100 elsewhere) per sentence, unpadded;
    and each sentence's position of each word's first piece (-1: truncated away)."""
    encoded = tokenizer([s["tokens"] for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    rows, firsts = [], []
    for i, sentence in enumerate(sentences):
        word_ids = encoded.word_ids(i)
        labels, first = [], [-1] * len(sentence["tokens"])
        previous = None
        for position, word in enumerate(word_ids):
            if word is not None and word != previous:
                first[word] = position
                labels.append(label_ids.get(sentence["tags"][word], 0) if sentence["tags"] else IGNORE)
            else:
                labels.append(IGNORE)
            previous = word
        ids = encoded["input_ids"][i]
        rows.append((ids, [1] * len(ids), labels))
        firsts.append(first)
    return rows, firsts


def batches(rows, batch_size: int, shuffle_seed=None):
    order = np.arange(len(rows))
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [rows[i] for i in order[start:start + batch_size]]
        width = max(len(r[0]) for r in chunk)
        pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731
        yield (tf.constant(pad([r[0] for r in chunk], 0)), tf.constant(pad([r[1] for r in chunk], 0)),
               tf.constant(pad([r[2] for r in chunk], IGNORE)))


class Tagger(tf.keras.Model):
    def __init__(self, encoder, num_labels: int):
        super().__init__()
        self.encoder = encoder
        self.dropout = tf.keras.layers.Dropout(0.1)
        self.classifier = tf.keras.layers.Dense(num_labels)  # Glorot uniform, Keras' default

    def call(self, input_ids, attention_mask, training=False):
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask, training=training)[0]
        return self.classifier(self.dropout(states, training=training))


def predict(model, rows, firsts, labels: List[str], batch_size: int = 64) -> List[List[str]]:
    step = tf.function(lambda ids, mask: tf.argmax(model(ids, mask), axis=-1), reduce_retracing=True)
    tags = []
    index = 0
    for ids, mask, _ in batches(rows, batch_size):
        predicted = step(ids, mask).numpy()
        for row in predicted:
            tags.append([labels[row[p]] if p >= 0 else "O" for p in firsts[index]])
            index += 1
    return tags


def f1(model, sentences, rows, firsts, labels) -> float:
    gold = [to_iob2(s["tags"]) for s in sentences]
    return float(f1_score(gold, [to_iob2(t) for t in predict(model, rows, firsts, labels)]))


def train_and_score(data_dir, model_dir: str, epochs: int, batch_size: int, learning_rate: float,
                    max_seq_length: int, seed: int, log=print) -> Dict:
    """Fine-tune `model_dir` on data_dir/train.jsonl; F1 on dev after each epoch and on dev and
    test at the end (entity level, seqeval, IOB2); seconds of training (evaluation excluded)."""
    tf.keras.utils.set_random_seed(seed)
    data = {name: read_split(Path(data_dir) / f"{name}.jsonl") for name in ("train", "dev", "test")}
    labels = sorted({t for s in data["train"] for t in s["tags"]})
    label_ids = {t: i for i, t in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = {name: encode(split, tokenizer, label_ids, max_seq_length) for name, split in data.items()}
    model = Tagger(TFAutoModel.from_pretrained(model_dir), len(labels))
    steps = epochs * -(-len(data["train"]) // batch_size)
    schedule = tf.keras.optimizers.schedules.PolynomialDecay(learning_rate, steps, 0.0)
    optimizer = tf.keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function(reduce_retracing=True)
    def train_step(ids, mask, gold):
        with tf.GradientTape() as tape:
            logits = model(ids, mask, training=True)
            weights = tf.cast(gold != IGNORE, tf.float32)
            losses = loss_fn(tf.maximum(gold, 0), logits)
            loss = tf.reduce_sum(losses * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
        grads = tape.gradient(loss, model.trainable_variables)
        # The pooler feeds nothing a token head reads: it has no gradient.
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None])
        return loss

    seconds, history = 0.0, []
    train_rows = encoded["train"][0]
    for epoch in range(epochs):
        start, losses = time.time(), []
        for ids, mask, gold in batches(train_rows, batch_size, shuffle_seed=seed + epoch):
            losses.append(float(train_step(ids, mask, gold)))
        seconds += time.time() - start
        dev_f1 = f1(model, data["dev"], *encoded["dev"], labels)
        history.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "dev_f1": dev_f1})
        log(f"reference epoch {epoch + 1}/{epochs}: train loss {np.mean(losses):.4f}, dev F1 {dev_f1:.4f}")
    test_f1 = f1(model, data["test"], *encoded["test"], labels) if data["test"] else float("nan")
    return {"dev_f1": history[-1]["dev_f1"], "test_f1": test_f1, "train_seconds": seconds, "history": history}
