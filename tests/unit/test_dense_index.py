"""The embedding model's vectors per scope: a scope whose chunks come and go is compacted, not grown for ever,
and what is left is still found, nearest first."""

from __future__ import annotations

from typing import Any

import numpy

from memory.embedding import DenseIndex, Embedder


class Letters(Embedder):
    """A stand-in model: a text's vector is its first letter's one-hot (so "nearest" is "same first letter")."""

    def __init__(self) -> None:
        super().__init__(model=None)

    def embed(self, texts: list[str]) -> Any:
        vectors = numpy.zeros((len(texts), 26), dtype=numpy.float32)
        for n, text in enumerate(texts):
            vectors[n, ord(text[0]) - ord("a")] = 1.0
        return vectors


def test_a_scope_whose_chunks_come_and_go_stays_small_and_keeps_finding_the_live_ones() -> None:
    dense = DenseIndex(Letters())
    for wave in range(20):  # each wave says 100 new things and forgets the wave before
        first = wave * 100
        dense.add([(first + n, "c:ana", "", "apple" if n == 0 else "zebra") for n in range(100)])
        if wave:
            dense.remove(range(first - 100, first))
    scope = dense.scopes["c:ana"]
    assert len(scope.ids) <= 200 and len(scope.matrix) <= 400  # 2,000 said, 100 alive
    assert set(dense.where) == set(range(1900, 2000))
    assert dense.nearest("apple pie", ["c:ana"], 1) == [1900]  # the live apple, at its new position
    dense.remove([1900])
    assert 1900 not in dense.nearest("apple pie", ["c:ana"], 5)
