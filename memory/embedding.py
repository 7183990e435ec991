"""The small local embedding model beside BM25 in memory search (the ``[memory]`` extra).

WordLlama's ``l2_supercat`` (256 dimensions, 16 MB): its weights and tokenizer ship
inside the ``wordllama`` wheel on the package registry, so nothing is fetched from
a model hub. Both files are checked against their pinned sha256 before they are
loaded; a mismatch (another version, a changed file) leaves search on BM25 alone,
logged. Without the extra, search is BM25 alone too.

The library looks for the bundled tokenizer under a folder name the wheel does
not use, then downloads it; it is given a folder that holds the bundled file
(a link to it) and downloads are turned off.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("memory.embedding")
VERSION = "0.4.0.post1"
# Inside the wordllama package: the files the model is, and their sha256 (from the wheel on PyPI).
WEIGHTS = ("weights/l2_supercat_256.safetensors", "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5")
TOKENIZER = ("tokenizers/l2_supercat_tokenizer_config.json",
             "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68")


class Embedder:
    """Texts to unit vectors (float16: half the memory, the same ranking)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def embed(self, texts: list[str]) -> Any:
        import numpy

        return numpy.asarray(self.model.embed(texts, norm=True), dtype=numpy.float16)


def load() -> Embedder | None:
    """The model, if the extra is installed and its files are the pinned ones; else None (BM25 alone)."""
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError:
        return None
    root = Path(wordllama.__file__).parent
    for name, digest in (WEIGHTS, TOKENIZER):
        path = root / name
        found = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "(missing)"
        if found != digest:
            log.warning("memory search stays on BM25: %s is not the pinned file (sha256 %s, expected %s; "
                        "install pincer[memory], which pins wordllama==%s)", path, found, digest, VERSION)
            return None
    cache = Path(tempfile.mkdtemp(prefix="pincer-wordllama-"))
    (cache / "tokenizers").mkdir()
    (cache / TOKENIZER[0]).symlink_to(root / TOKENIZER[0])
    model = WordLlama.load(config="l2_supercat", dim=256, cache_dir=cache, disable_download=True)
    log.info("memory search ranks with BM25 and the local embedding model (wordllama %s, l2_supercat 256)", VERSION)
    return Embedder(model)


class _Scope:
    """One scope's vectors (an identity's conversations, or one agent's notes of one owner), grown in place."""

    def __init__(self, dims: int) -> None:
        import numpy

        self.matrix = numpy.zeros((64, dims), dtype=numpy.float16)
        self.alive = numpy.zeros(64, dtype=bool)
        self.ids: list[int] = []
        self.dead = 0

    def add(self, rowid: int, vector: Any) -> int:
        import numpy

        at = len(self.ids)
        if at == len(self.matrix):  # full: twice the room
            self.matrix = numpy.concatenate([self.matrix, numpy.zeros_like(self.matrix)])
            self.alive = numpy.concatenate([self.alive, numpy.zeros_like(self.alive)])
        self.matrix[at], self.alive[at] = vector, True
        self.ids.append(rowid)
        return at

    def compact(self) -> None:
        """Only the live vectors kept, in twice their room: a scope whose chunks come and go (an identity's
        conversations, archived as new ones are said) would otherwise grow for ever."""
        import numpy

        keep = numpy.flatnonzero(self.alive[: len(self.ids)])
        room = max(64, 2 * len(keep))
        matrix = numpy.zeros((room, self.matrix.shape[1]), dtype=self.matrix.dtype)
        matrix[: len(keep)] = self.matrix[keep]
        self.matrix, self.alive = matrix, numpy.zeros(room, dtype=bool)
        self.alive[: len(keep)] = True
        self.ids, self.dead = [self.ids[int(i)] for i in keep], 0


class DenseIndex:
    """Chunks' vectors by scope, and the nearest ones to a query: the second ranking beside BM25."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.scopes: dict[str, _Scope] = {}
        self.where: dict[int, tuple[str, int, str]] = {}  # rowid -> (scope, position, turn)

    def add(self, rows: list[tuple[int, str, str, str]]) -> None:
        """``(rowid, scope, turn, text)`` of new chunks (embedded in one batch)."""
        if not rows:
            return
        vectors = self.embedder.embed([text for *_, text in rows])
        for (rowid, scope, turn, _), vector in zip(rows, vectors, strict=True):
            held = self.scopes.setdefault(scope, _Scope(len(vector)))
            self.where[rowid] = (scope, held.add(rowid, vector), turn)

    def remove(self, rowids: Iterable[int]) -> None:
        touched: set[str] = set()
        for rowid in rowids:
            found = self.where.pop(rowid, None)
            if found is not None:
                held = self.scopes[found[0]]
                held.alive[found[1]] = False
                held.dead += 1
                touched.add(found[0])
        for name in touched:  # mostly dead: compacted, and the live ones' positions follow
            held = self.scopes[name]
            if held.dead * 2 > len(held.ids) >= 64:
                held.compact()
                for at, rowid in enumerate(held.ids):
                    self.where[rowid] = (name, at, self.where[rowid][2])

    def drop(self, scope: str) -> None:
        """A whole scope's vectors leave (its chunks were evicted)."""
        held = self.scopes.pop(scope, None)
        for rowid in held.ids if held is not None else []:
            self.where.pop(rowid, None)

    def nearest(self, query: str, scopes: list[str], k: int, *, turn: str = "") -> list[int]:
        """The ``k`` chunks of ``scopes`` nearest to ``query``, nearest first (turn ``turn``'s left out)."""
        import numpy

        found: list[tuple[float, int]] = []
        q = self.embedder.embed([query])[0].astype(numpy.float32)
        for name in scopes:
            scope = self.scopes.get(name)
            if scope is None or not scope.ids:
                continue
            n = len(scope.ids)
            scores = scope.matrix[:n].astype(numpy.float32) @ q
            scores[~scope.alive[:n]] = -numpy.inf
            for at in numpy.argsort(-scores)[: k * 2]:
                rowid = scope.ids[int(at)]
                if numpy.isfinite(scores[at]) and (not turn or self.where[rowid][2] != turn):
                    found.append((float(scores[at]), rowid))
        return [rowid for _, rowid in sorted(found, reverse=True)[:k]]
