"""The search space (KD-NAS Table 1) and the encoding of its states for the controller.

A state is an `Arch` (layers, heads, hidden, intermediate, activation). The paper's Table 1 lists
the candidate values for all dimensions but the hidden size; its "2400 student architectures"
and the hidden sizes of its Table 2 (288, 384, 576) give hidden sizes {288, 384, 576, 768}: 5 x 5
x 4 x 8 x 3 = 2400, every one valid (each hidden size is divisible by every head count). Other
hidden sizes may be passed; combinations with hidden % heads != 0 are then left out.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from xtremedistil_tf.errors import ConfigError

LAYERS = (3, 4, 6, 10, 12)
HEADS = (2, 3, 4, 6, 12)
HIDDEN = (288, 384, 576, 768)
INTERMEDIATE = (384, 512, 576, 768, 1024, 1536, 2048, 3072)
ACTIVATIONS = ("gelu", "relu", "silu")


@dataclass(frozen=True, order=True)
class Arch:
    """One student architecture; `key` is its stable name ("4,12,576,768,gelu", Table 2's notation)."""

    layers: int
    heads: int
    hidden: int
    intermediate: int
    activation: str

    @property
    def key(self) -> str:
        return f"{self.layers},{self.heads},{self.hidden},{self.intermediate},{self.activation}"

    @classmethod
    def from_key(cls, key: str) -> "Arch":
        fields = key.split(",")
        if len(fields) != 5:
            raise ConfigError(f"architecture {key!r}: expected 'layers,heads,hidden,intermediate,activation'")
        try:
            return cls(int(fields[0]), int(fields[1]), int(fields[2]), int(fields[3]), fields[4].strip())
        except ValueError:
            raise ConfigError(f"architecture {key!r}: layers, heads, hidden and intermediate must be integers") from None

    def to_dict(self) -> dict:
        return asdict(self)

    def bert_config(self, base: Optional[dict] = None) -> dict:
        """BertConfig fields for this architecture on top of `base` (the teacher's vocab, positions...)."""
        return {**(base or {}), "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "hidden_size": self.hidden, "intermediate_size": self.intermediate, "hidden_act": self.activation}


@dataclass(frozen=True)
class SearchSpace:
    """The candidate values per dimension; `states` lists the valid combinations in a fixed order."""

    layers: Sequence[int] = LAYERS
    heads: Sequence[int] = HEADS
    hidden: Sequence[int] = HIDDEN
    intermediate: Sequence[int] = INTERMEDIATE
    activations: Sequence[str] = ACTIVATIONS

    def __post_init__(self):
        for name in ("layers", "heads", "hidden", "intermediate", "activations"):
            values = tuple(getattr(self, name))
            if not values:
                raise ConfigError(f"search space dimension {name!r} is empty")
            object.__setattr__(self, name, values)
        if not self.states:
            raise ConfigError("search space has no valid state (no hidden size divisible by any head count)")

    @property
    def states(self) -> List[Arch]:
        return [Arch(*combo) for combo in itertools.product(self.layers, self.heads, self.hidden,
                                                              self.intermediate, self.activations)
                if combo[2] % combo[1] == 0]

    def restricted_to_depth(self, max_layers: int) -> "SearchSpace":
        """The space without students deeper than `max_layers` (the teacher's depth by default, so
        every student layer has a distinct teacher layer to learn from)."""
        layers = tuple(n for n in self.layers if n <= max_layers)
        if not layers:
            raise ConfigError(f"no layer count in {self.layers} is <= {max_layers}")
        return SearchSpace(layers, self.heads, self.hidden, self.intermediate, self.activations)

    @property
    def encoding_size(self) -> int:
        return sum(len(v) for v in (self.layers, self.heads, self.hidden, self.intermediate, self.activations))

    def encode(self, arch: Arch) -> np.ndarray:
        """One-hot per dimension, concatenated: [encoding_size] float32."""
        parts = []
        for values, value in zip((self.layers, self.heads, self.hidden, self.intermediate, self.activations),
                                 (arch.layers, arch.heads, arch.hidden, arch.intermediate, arch.activation)):
            one_hot = np.zeros(len(values), np.float32)
            if value not in values:
                raise ConfigError(f"architecture {arch.key} has {value!r}, not among the space's {list(values)}")
            one_hot[values.index(value)] = 1.0
            parts.append(one_hot)
        return np.concatenate(parts)

    def to_dict(self) -> Dict[str, list]:
        return {"layers": list(self.layers), "heads": list(self.heads), "hidden": list(self.hidden),
                "intermediate": list(self.intermediate), "activations": list(self.activations)}
