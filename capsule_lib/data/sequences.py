"""A GENERATED variable-length sequence task for routing over tokens (the Heinsen chapter's "any domain").

Every sequence is ``length`` tokens (``min_len`` ... ``max_len``, then padding ``0``): filler tokens drawn
from ``n_markers + 1 ... vocab - 1`` and a few **marker** tokens ``1 ... n_markers`` at random positions.
The label is the marker that occurs most often (2 to 4 times; every other marker fewer times, possibly not at
all), so a classifier has to find a handful of tokens anywhere in a sequence of any length and compare their
counts: what routing from a variable number of inputs is for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from .._contracts import checked

__all__ = ["TokenSequences", "marker_sequences", "PAD"]

#: the padding token
PAD = 0


@dataclass
class TokenSequences:
    """``tokens`` int64 ``[N, max_len]`` (``PAD`` after each sequence's end), ``labels`` ``[N]``,
    ``n_tokens`` ``[N]``; marker ``k`` (token id ``k + 1``) is class ``k``."""

    tokens: torch.Tensor
    labels: torch.Tensor
    n_tokens: torch.Tensor
    classes: tuple[str, ...]
    vocab: int
    generated: bool = True

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def padding_mask(self) -> torch.Tensor:
        """bool ``[N, max_len]``, True = padding."""
        return self.tokens == PAD

    def is_marker(self) -> torch.Tensor:
        """bool ``[N, max_len]``: which positions hold a marker token."""
        return (self.tokens >= 1) & (self.tokens <= len(self.classes))

    def subset(self, n: int) -> TokenSequences:
        return TokenSequences(self.tokens[:n], self.labels[:n], self.n_tokens[:n], self.classes, self.vocab)


@checked
def marker_sequences(
    n: int,
    seed: int = 0,
    *,
    n_markers: int = 4,
    vocab: int = 32,
    min_len: int = 16,
    max_len: int = 40,
) -> TokenSequences:
    """``n`` GENERATED sequences of the majority-marker task (see the module docstring); deterministic in
    ``seed``."""
    if n < 1:
        raise ValueError(f"marker_sequences: n must be a number of sequences >= 1, got {n}")
    if not 1 <= n_markers < vocab - 1:
        raise ValueError(f"need 1 <= n_markers < vocab - 1, got n_markers={n_markers}, vocab={vocab}")
    if not 3 * n_markers + 1 <= min_len <= max_len:
        raise ValueError(f"need 3 * n_markers + 1 <= min_len <= max_len, got {min_len}, {max_len}")
    g = torch.Generator().manual_seed(seed)
    n_tokens = torch.randint(min_len, max_len + 1, (n,), generator=g)  # [N]
    labels = torch.randint(0, n_markers, (n,), generator=g)  # [N]
    top = torch.randint(2, 5, (n,), generator=g)  # [N] occurrences of the winning marker
    # every other marker occurs 0 ... top - 1 times
    counts = (torch.rand(n, n_markers, generator=g) * top[:, None]).floor().long()  # [N, K]
    counts[torch.arange(n), labels] = top
    tokens = torch.randint(n_markers + 1, vocab, (n, max_len), generator=g)  # fillers
    tokens[torch.arange(max_len)[None, :] >= n_tokens[:, None]] = PAD
    for s in range(n):  # place the markers at random distinct positions of the sequence
        pos = torch.randperm(int(n_tokens[s]), generator=g)
        k = 0
        for m in range(n_markers):
            c = int(counts[s, m])
            tokens[s, pos[k : k + c]] = m + 1
            k += c
    classes = tuple(f"marker {chr(ord('A') + m)}" for m in range(n_markers))
    return TokenSequences(tokens, labels, n_tokens, classes, vocab)
