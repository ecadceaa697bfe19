"""Every loss of the papers in one table: docs/equations.md is generated from it.

An entry names the paper and equation, the student output it reads (`prediction`), the cached teacher
targets (`target`: batch keys), its function, the positions it averages over (`mask(batch, pad_id)`)
and how those are counted (`count(mask)`: what a replica's share of a global batch is weighted by under
tf.distribute). Every function is called `fn(prediction, target, mask)`; an entry that reads several
outputs or targets gets them as tuples in the order listed. All reduce with `reduce.masked_mean`.

The staged XtremeDistil loop and the multi-grained loop look their losses up with `get(name, variant)`
(variants: representation mse | kld, token_em / token_pos ce | kl); each teacher's fine-tuning loss is the
entry its `LOSS` names. Regenerate the docs with
`python -m xtremedistil_tf.losses.registry > docs/equations.md` (tests/test_loss_registry.py checks them).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import tensorflow as tf

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses import hidden, sequence, shared_projection, xtremedistil
from xtremedistil_tf.losses.reduce import row_mask

XTREMEDISTIL = "XtremeDistil (Mukherjee & Awadallah, ACL 2020)"
MULTI_GRAINED = "Multi-grained KD (Zhou et al., NAACL 2021)"
KD_NAS = "KD-NAS (Trivedi et al., 2023)"
SUBWORDS = "Optimal subwords and shared projections (Zhao et al., 2019)"
TEACHERS = "Teacher fine-tuning (the teachers' own losses, before distillation)"
SOFT_TARGETS = "Soft targets (Hinton et al., 2015; not in the papers: strategy D4.2-KD)"
CRF_OUTPUT = ("potentials", "transitions")
KBEST = ("kbest_tags", "kbest_probs", "kbest_valid")


def real_tokens(batch, pad_id: int) -> tf.Tensor:
    """real tokens"""
    return tf.cast(batch["attention_mask"], tf.float32)


def labeled_tokens(batch, pad_id: int) -> tf.Tensor:
    """real tokens with a label (not [PAD])"""
    return xtremedistil.label_mask(batch["label_ids"], batch["attention_mask"], pad_id)


def teacher_trained_tokens(batch, pad_id: int) -> tf.Tensor:
    """real tokens the teacher's logits were trained at (all, or the first pieces that a first-piece
    teacher's cache marks with `teacher_mask`)"""
    return xtremedistil.teacher_mask(batch, batch["attention_mask"])


def labeled_row_tokens(batch, pad_id: int) -> tf.Tensor:
    """real tokens of the labeled rows (rows whose real tokens all carry a label)"""
    labeled = sequence.labeled_rows(batch["label_ids"], batch["attention_mask"], pad_id)
    return real_tokens(batch, pad_id) * tf.cast(labeled, tf.float32)[:, None]


def rows_with_target(batch, pad_id: int) -> tf.Tensor:
    """real tokens of the rows with a target (every row when the batch has the teacher's k-best paths:
    unlabeled rows learn its top-1 path; else the labeled rows)"""
    if "kbest_tags" in batch:
        return real_tokens(batch, pad_id)
    return labeled_row_tokens(batch, pad_id)


def labeled_texts(batch, pad_id: int) -> tf.Tensor:
    """texts with a label (label_ids [B] not NO_LABEL)"""
    return tf.cast(tf.not_equal(batch["label_ids"], pad_id), tf.float32)


def positions(mask) -> tf.Tensor:
    """positions"""
    return tf.reduce_sum(tf.cast(mask, tf.float32))


def rows(mask) -> tf.Tensor:
    """rows"""
    return tf.reduce_sum(row_mask(mask))


@dataclass(frozen=True)
class Loss:
    name: str
    variant: Optional[str]
    paper: str
    equation: str
    prediction: Tuple[str, ...]  # the student outputs it reads
    target: Tuple[str, ...]      # the cached targets (batch keys) it reads
    fn: Callable                 # fn(prediction, target, mask) -> scalar
    test: str                    # the test that checks it against the formula
    mask: Callable = real_tokens  # mask(batch, pad_id): the positions it averages over
    count: Callable = positions   # count(mask): how many it averages over
    mean_over: Optional[str] = None  # for losses whose loop builds no mask here: what they average over

    @property
    def key(self) -> str:
        return self.name if self.variant is None else f"{self.name}/{self.variant}"

    def __call__(self, outputs: Dict[str, tf.Tensor], batch: Dict[str, tf.Tensor], mask: tf.Tensor) -> tf.Tensor:
        """The loss of `outputs` (the student's) against `batch` (the targets) over `mask`."""
        return self.fn(_pick(outputs, self.prediction), _pick(batch, self.target), mask)


def _pick(values, keys):
    return values[keys[0]] if len(keys) == 1 else tuple(values[k] for k in keys)


_XD_TESTS = "tests/test_xtremedistil_losses.py::"
_SEQ_TESTS = "tests/test_sequence_losses.py::"
_PROJECTION_TEST = "tests/test_shared_projection.py::test_loss_equals_the_sum_of_per_variable_mse_of_u_x_v"
_TEACHER_TEST = "tests/test_loss_registry.py::test_each_teacher_trains_on_its_entry"
ENTRIES = (
    Loss("ce", None, XTREMEDISTIL, "Eq. 2", ("scores",), ("label_ids",), xtremedistil.cross_entropy,
         _XD_TESTS + "test_cross_entropy_matches_numpy_and_skips_pad_labels", labeled_tokens),
    Loss("logits", None, XTREMEDISTIL, "Eq. 4", ("logits",), ("logits",), xtremedistil.logit_mse,
         _XD_TESTS + "test_logit_mse_matches_numpy_and_ignores_padding", teacher_trained_tokens),
    Loss("soft", None, SOFT_TARGETS, "KL(softmax(t) ‖ softmax(s)), T = 1", ("scores",), ("logits",),
         xtremedistil.soft_target_kl, _XD_TESTS + "test_soft_target_kl_matches_numpy_and_is_zero_at_the_teacher",
         teacher_trained_tokens),
    Loss("representation", "mse", XTREMEDISTIL, "Eq. 6 (MSE, the default)", ("projection",), ("hidden",),
         xtremedistil.representation_mse, _XD_TESTS + "test_representation_mse_matches_numpy"),
    Loss("representation", "kld", XTREMEDISTIL, "Eq. 6", ("projection",), ("hidden",),
         xtremedistil.representation_kld, _XD_TESTS + "test_representation_kld_is_kl_teacher_to_student_over_hidden_dim"),
    Loss("hard", None, MULTI_GRAINED, "Eq. 7", CRF_OUTPUT, ("label_ids",), sequence.hard_loss,
         _SEQ_TESTS + "test_hard_loss_is_gold_nll", rows_with_target, rows),
    Loss("seq_ce", None, MULTI_GRAINED, "Eq. 4-5", CRF_OUTPUT, KBEST, sequence.kbest_seq_ce,
         _SEQ_TESTS + "test_kbest_seq_ce_matches_brute_force_with_residual_term", count=rows),
    Loss("seq_fuzzy", None, MULTI_GRAINED, "Eq. 3, 6", CRF_OUTPUT, KBEST, sequence.fuzzy_loss,
         _SEQ_TESTS + "test_fuzzy_is_binary_ce_on_the_top_k_mass", count=rows),
    *(Loss("token_em", variant, MULTI_GRAINED, equation, ("logits",), ("logits",),
           functools.partial(sequence.token_emission_kd, token_loss=variant),
           _SEQ_TESTS + "test_token_emission_kd_is_eq10_cross_entropy_over_real_tokens", teacher_trained_tokens)
      for variant, equation in (("ce", "Eq. 10"), ("kl", "Eq. 10 minus the teacher's entropy"))),
    *(Loss("token_pos", variant, MULTI_GRAINED, equation, CRF_OUTPUT, ("marginals",),
           functools.partial(sequence.token_posterior_kd, token_loss=variant),
           _SEQ_TESTS + "test_token_posterior_kd_uses_exact_crf_marginals")
      for variant, equation in (("ce", "Eq. 10"), ("kl", "Eq. 10 minus the teacher's entropy"))),
    Loss("hidden_states", None, KD_NAS, "Eq. 1", ("projected hidden_states",), ("hidden_states",),
         hidden.hidden_state_loss,
         "tests/test_hidden_losses.py::test_hidden_state_loss_sums_or_averages_the_mapped_pairs",
         mean_over="real tokens and the teacher's width, summed over the mapped layer pairs"),
    Loss("minilm_v2", None, KD_NAS, "Eq. 5-6", ("query, key, value",), ("query, key, value",),
         hidden.minilm_v2_loss,
         "tests/test_hidden_losses.py::test_relation_kl_against_numpy_with_padding_and_different_widths",
         mean_over="relation heads x real query tokens, summed over Q-Q, K-K, V-V"),
    *(Loss("shared_projection", direction, SUBWORDS, equation, (projected,), (target,),
           shared_projection.variable_mse, _PROJECTION_TEST,
           mean_over="elements of a variable, summed over the variable pairs")
      for direction, equation, projected, target in (("down", "Eq. 1", "U T V", "student variable"),
                                                      ("up", "Eq. 2", "U' S V'", "teacher variable"))),
    Loss("mlm", None, SUBWORDS, "Eq. 3", ("MLM logits",), ("masked piece ids",), xtremedistil.cross_entropy,
         "tests/test_subwords_models.py::test_masked_positions_use_the_softmax_of_their_vocabulary",
         mean_over="masked positions"),
    # The teachers' fine-tuning losses (teachers/: each teacher's `LOSS` names its entry).
    Loss("teacher_token_ce", None, TEACHERS, "standard fine-tuning (the softmax token teacher)", ("logits",),
         ("label_ids",), xtremedistil.cross_entropy, _TEACHER_TEST, labeled_tokens),
    Loss("teacher_crf_nll", None, TEACHERS, "standard fine-tuning: CRF NLL of the gold tags, Eq. 7's form (the "
         "BERT+CRF teacher of Multi-grained KD, Sec. 5.2)", CRF_OUTPUT, ("label_ids",), sequence.hard_loss,
         _TEACHER_TEST, labeled_row_tokens, rows),
    Loss("teacher_class_ce", None, TEACHERS, "standard fine-tuning (the classifier teacher of XtremeDistil, Sec. 6.6)",
         ("logits",), ("label_ids",), xtremedistil.cross_entropy, _TEACHER_TEST, labeled_texts),
)
LOSSES: Dict[str, Loss] = {entry.key: entry for entry in ENTRIES}


def names(paper: str) -> Tuple[str, ...]:
    """The loss names of one paper, in table order."""
    return tuple(dict.fromkeys(entry.name for entry in ENTRIES if entry.paper == paper))


def variants(name: str) -> Tuple[str, ...]:
    """The variants of loss `name`, the default first (empty for a loss without variants)."""
    return tuple(entry.variant for entry in ENTRIES if entry.name == name and entry.variant)


def get(name: str, variant: Optional[str] = None) -> Loss:
    """The entry of loss `name`; `variant` picks one of its variants (ignored for a loss without any;
    None: the default)."""
    choices = variants(name)
    key = f"{name}/{variant or choices[0]}" if choices else name
    if key not in LOSSES:
        options = (f"{name} variants {', '.join(choices)}" if choices
                   else f"losses {', '.join(dict.fromkeys(e.name for e in ENTRIES))}")
        raise ConfigError(f"unknown loss {key!r}; known {options}")
    return LOSSES[key]


def _function_name(fn) -> str:
    if isinstance(fn, functools.partial):
        keywords = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{_function_name(fn.func)}(..., {keywords})"
    return f"{fn.__module__.removeprefix('xtremedistil_tf.')}.{fn.__name__}"


def _doc(fn) -> str:
    return " ".join(fn.__doc__.split())


def markdown() -> str:
    """docs/equations.md: paper -> equation -> function -> test, one row per entry."""
    lines = ["# Loss equations",
             "",
             "Generated from `xtremedistil_tf/losses/registry.py` by "
             "`python -m xtremedistil_tf.losses.registry > docs/equations.md`; do not edit by hand "
             "(`tests/test_loss_registry.py` fails when this file and the registry differ).",
             "",
             "Every function is called `fn(prediction, target, mask)` and reduces with `losses.reduce.masked_mean`. "
             "`prediction` names the student outputs it reads, `target` the cached teacher outputs or labels "
             "(batch keys); several are passed as a tuple in that order. \"Mean over\" is what the value "
             "averages over, the count a replica's share of a global batch is weighted by. Every entry is also "
             "checked against its formula by `tests/test_loss_registry.py::test_entry_gives_its_formula`."]
    for paper in dict.fromkeys(entry.paper for entry in ENTRIES):
        lines += ["", f"## {paper}", "",
                  "| loss | equation | prediction | target | function | mean over | test |",
                  "|---|---|---|---|---|---|---|"]
        for e in (entry for entry in ENTRIES if entry.paper == paper):
            lines.append(f"| `{e.key}` | {e.equation} | {', '.join(f'`{k}`' for k in e.prediction)} | "
                         f"{', '.join(f'`{k}`' for k in e.target)} | `{_function_name(e.fn)}` | "
                         f"{e.mean_over or f'{e.count.__doc__}: {_doc(e.mask)}'} | `{e.test}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
