"""The one in-memory record every reader produces."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Sentence:
    """A tokenized sentence with optional per-token tags, language and sentence label.

    `tags` is None for unlabeled text (transfer sets). `label` is the class of the whole
    sentence in sentence-classification data (`label<TAB>text` files), None otherwise. Lists are accepted and
    stored as tuples so a Sentence is hashable and cannot be mutated by
    downstream code that shares it between splits.
    """

    tokens: tuple[str, ...]
    tags: Optional[tuple[str, ...]] = None
    lang: Optional[str] = None
    label: Optional[str] = None
    # The raw text the tokens were split from (data/wordsplit.resplit), when it is not the tokens joined by single
    # spaces: the words are its substrings, in order, and entity character spans index it.
    text: Optional[str] = None

    def __post_init__(self) -> None:
        # frozen=True forbids normal assignment; object.__setattr__ is the
        # documented way to normalise fields in __post_init__.
        object.__setattr__(self, "tokens", tuple(self.tokens))
        if self.tags is not None:
            object.__setattr__(self, "tags", tuple(self.tags))
            if len(self.tags) != len(self.tokens):
                raise ValueError(
                    f"Sentence has {len(self.tokens)} tokens but {len(self.tags)} tags; "
                    "expected one tag per token"
                )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def raw_text(self) -> str:
        """The text an exported model is given for this sentence: `text`, or the tokens joined by single spaces."""
        return self.text if self.text is not None else " ".join(self.tokens)
