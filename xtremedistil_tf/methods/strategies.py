"""Distillation strategies of XtremeDistil (Table 3) as data: ordered stages run by one loop.

A stage names its loss terms (loss, data source, weight), and its unfreeze schedule: a list of
steps, top-down, each naming the layers that join the trainable set at that step. The staged loop
(methods/staged.py) freezes every layer at each step, unfreezes the layers of this and all earlier
steps of the stage, trains and restores the best weights by dev loss.

Sources: "train" is the labeled train set (CE on its labels); "transfer" is the unlabeled transfer
set with cached teacher outputs (logit and representation losses). Weights given as "alpha",
"beta", "gamma" are read from the run's config (Eq. 7); numbers are used as they are.

As implemented (paper section 5, Table 3, Table 4, Algorithm 1):

| strategy | stage 1                          | stage 2                                            | stage 3                         |
|----------|----------------------------------|----------------------------------------------------|---------------------------------|
| D0       | CE(train), end-to-end, per lang. |                                                    |                                 |
| D0-S     | CE(train), end-to-end            |                                                    |                                 |
| D1       | a*CE(train) + g*LL(transfer)     |                                                    |                                 |
| D2       | a*CE + b*RL + g*LL               |                                                    |                                 |
| D3.1     | RL(transfer), end-to-end         | a*CE + g*LL, end-to-end                            |                                 |
| D3.2     | RL(transfer), end-to-end         | a*CE + g*LL: [W^r, W^s], projection, BiLSTM, emb.  |                                 |
| D4.1     | RL(transfer), end-to-end         | LL(transfer), end-to-end                           | CE(train), end-to-end           |
| D4.2     | RL(transfer), end-to-end         | LL: W^r, projection, BiLSTM, word emb.             | CE: W^s, projection, BiLSTM, emb.|
| D4.2-KD  | as D4.2                          | as D4.2                                            | CE + KL(teacher soft targets), both on the labeled windows, as D4.2 |

D4.2-KD is not in the paper (`Strategy.paper` False; bin/ablate runs it when named).

Stage 1 trains embeddings, BiLSTM and projection together (section 5.2; Table 4 lists no stage-1
steps, and the authors' code trains it end-to-end). "End-to-end" is one step with every layer the
stage's losses reach; D3.2's joint stage unfreezes both of its heads at its first step.
`bilstm` stands for the student's sequence layer: a transformer student's `encoder`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.losses.registry import SOFT_TARGETS, XTREMEDISTIL, names

# The losses a stage may name (losses/registry.py: the student output each reads and its target).
LOSSES = names(XTREMEDISTIL) + names(SOFT_TARGETS)
SOURCES = ("train", "transfer")
BODY = ("projection", "bilstm", "word_embedding")


@dataclass(frozen=True)
class LossTerm:
    """One weighted loss on one data source."""

    loss: str
    source: str
    weight: Union[str, float] = 1.0

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ConfigError(f"unknown loss {self.loss!r}; choose one of {sorted(LOSSES)}")
        if self.source not in SOURCES:
            raise ConfigError(f"unknown data source {self.source!r}; choose one of {SOURCES}")


@dataclass(frozen=True)
class Stage:
    """Loss terms optimised together, and the unfreeze schedule (steps of layer names, top-down)."""

    name: str
    terms: Tuple[LossTerm, ...]
    unfreeze: Tuple[Tuple[str, ...], ...]

    @property
    def sources(self) -> Tuple[str, ...]:
        return tuple(s for s in SOURCES if any(t.source == s for t in self.terms))

    @property
    def eval_head(self) -> Optional[str]:
        """The head whose argmax is this stage's tagger: softmax if trained on labels, else the
        logit regressor, None for a representation-only stage (no tagger yet)."""
        losses = {t.loss for t in self.terms}
        if "ce" in losses:
            return "softmax"
        return "logits" if "logits" in losses else None


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    stages: Tuple[Stage, ...]
    # D0 trains one student per language; the caller splits the data, the stages are D0-S's.
    per_language: bool = False
    # A strategy of Table 3 (bin/ablate compares these by default), or one added here.
    paper: bool = True


def _end_to_end(*heads: str) -> Tuple[Tuple[str, ...], ...]:
    return (tuple(heads) + BODY,)


def _gradual(*heads: str) -> Tuple[Tuple[str, ...], ...]:
    return (tuple(heads),) + tuple((layer,) for layer in BODY)


_CE = LossTerm("ce", "train")
_LL = LossTerm("logits", "transfer")
_RL = LossTerm("representation", "transfer")
_CE_A = LossTerm("ce", "train", "alpha")
_RL_B = LossTerm("representation", "transfer", "beta")
_LL_G = LossTerm("logits", "transfer", "gamma")

_REPR_STAGE = Stage("representation", (_RL,), (BODY,))

STRATEGIES: Dict[str, Strategy] = {s.name: s for s in (
    Strategy("D0", "labels only, one student per language",
             (Stage("labels", (_CE,), _end_to_end("softmax")),), per_language=True),
    Strategy("D0-S", "labels across all languages",
             (Stage("labels", (_CE,), _end_to_end("softmax")),)),
    Strategy("D1", "labels and logits, jointly",
             (Stage("labels+logits", (_CE_A, _LL_G), _end_to_end("softmax", "logits")),)),
    Strategy("D2", "labels, logits and representations, jointly (Eq. 7)",
             (Stage("labels+logits+representation", (_CE_A, _RL_B, _LL_G),
                    _end_to_end("softmax", "logits")),)),
    Strategy("D3.1", "(S1) representations (S2) labels and logits",
             (_REPR_STAGE, Stage("labels+logits", (_CE_A, _LL_G), _end_to_end("logits", "softmax")))),
    Strategy("D3.2", "(S1) representations (S2) labels and logits, gradual unfreezing",
             (_REPR_STAGE, Stage("labels+logits", (_CE_A, _LL_G), _gradual("logits", "softmax")))),
    Strategy("D4.1", "(S1) representations (S2) logits (S3) labels",
             (_REPR_STAGE, Stage("logits", (_LL,), _end_to_end("logits")),
              Stage("labels", (_CE,), _end_to_end("softmax")))),
    Strategy("D4.2", "(S1) representations (S2) logits (S3) labels, gradual unfreezing (the default)",
             (_REPR_STAGE, Stage("logits", (_LL,), _gradual("logits")),
              Stage("labels", (_CE,), _gradual("softmax")))),
    # Not in the paper: D4.2 whose last stage also learns the teacher's distribution over the tags on the labeled
    # windows (soft targets), so that it does not fit the gold labels alone at the end (issue 50: names the labeled
    # data never held).
    Strategy("D4.2-KD", "D4.2 whose labels stage adds the teacher's soft targets on the labeled windows (not in "
                        "the paper)",
             (_REPR_STAGE, Stage("logits", (_LL,), _gradual("logits")),
              Stage("labels+soft", (_CE, LossTerm("soft", "train")), _gradual("softmax"))), paper=False),
)}


def get_strategy(name: str) -> Strategy:
    """The strategy registered as `name` (see STRATEGIES)."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name]
