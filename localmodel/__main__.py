"""``python -m localmodel serve --model PATH --port N``: the local model's server on loopback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localmodel")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a GGUF model over the OpenAI API on loopback")
    serve.add_argument("--model", type=Path, required=True)
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--context", type=int, default=8192)
    serve.add_argument("--warm-file", type=Path, help="keep the prompt's prefix here; read it ahead on start")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    from localmodel import KEY_VARIABLE
    from localmodel.llama import LlamaGenerator
    from localmodel.server import LocalModelServer

    key = os.environ.pop(KEY_VARIABLE, "")
    if len(key) < 16:
        print(f"localmodel: error: set {KEY_VARIABLE} to this start's key (16+ characters; `pincer up` makes one)",
              file=sys.stderr)
        return 78
    server = LocalModelServer(LlamaGenerator(args.model, context=args.context), key=key, warm_file=args.warm_file)
    uvicorn.run(server.app(), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
