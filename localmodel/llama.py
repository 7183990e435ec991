"""The real generator: a GGUF run by llama.cpp (llama-cpp-python, the ``[local]`` extra), on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localmodel.gguf import metadata
from localmodel.server import Generated


class LlamaGenerator:
    def __init__(self, model: Path, *, context: int = 8192, threads: int | None = None) -> None:
        from llama_cpp import Llama  # only with the [local] extra installed

        found = metadata(model, {"tokenizer.chat_template", "general.name"})
        if "tokenizer.chat_template" not in found:
            raise ValueError(f"{model} carries no chat template (tokenizer.chat_template); it cannot be chatted with")
        self.name = str(found.get("general.name") or model.stem)
        self.template = str(found["tokenizer.chat_template"])
        self.llama: Any = Llama(model_path=str(model), n_ctx=context, n_threads=threads or os.cpu_count() or 2,
                                verbose=False)
        eos = self.llama.token_eos()
        self.stop = [self.llama.detokenize([eos]).decode(errors="ignore"), "<|im_end|>", "<|endoftext|>"]

    def warm(self, prompt: str) -> None:
        self.llama.reset()
        self.llama.eval(self.llama.tokenize(prompt.encode(), add_bos=False, special=True))

    def generate(self, prompt: str, *, max_tokens: int, temperature: float) -> Generated:
        out = self.llama.create_completion(prompt, max_tokens=max_tokens, temperature=temperature,
                                           stop=[s for s in self.stop if s])
        usage = out.get("usage", {})
        return Generated(out["choices"][0]["text"], int(usage.get("prompt_tokens", 0)),
                         int(usage.get("completion_tokens", 0)))
