"""`pincer setup`: the few answers a first run needs, written to the data dir so nobody has to read YAML.

The model (a provider and its key, a local OpenAI-compatible server, or the local model), optionally one
chat app (its credentials checked against the platform first), and the owner's name. It writes
``<data dir>/config.yaml`` (only the keys answered, under a header) and ``<data dir>/secrets.env`` (0600):
a key or a token goes in the second alone. An existing config is replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from bus.config import Config
from gateway.channels.config import KNOWN
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.cli.answers import Asker, Unanswered, config_target, outranked, store_secrets, write_config
from gateway.cli.channel_setup import Answered, add_arguments, refusal
from gateway.cli.channel_setup import ask as ask_channel

# A provider's name, its key's variable (litellm reads it), its model when none is named, and how it is shown.
PROVIDERS = {
    "openai": ("OPENAI_API_KEY", "openai/gpt-4o-mini", "OpenAI"),
    "anthropic": ("ANTHROPIC_API_KEY", "anthropic/claude-3-5-haiku-latest", "Anthropic"),
    "gemini": ("GEMINI_API_KEY", "gemini/gemini-2.0-flash", "Google Gemini"),
    "groq": ("GROQ_API_KEY", "groq/llama-3.3-70b-versatile", "Groq"),
}
SERVER, LOCAL = "server", "local"
# What the model question offers, by the name that answers it.
MODEL_CHOICES = {**{name: f"{shown} (an API key)" for name, (_, _, shown) in PROVIDERS.items()},
                 SERVER: "a local OpenAI-compatible server (Ollama, llama.cpp, vLLM, LM Studio: its URL)",
                 LOCAL: "the local model: no key, runs on this machine (its first start fetches ~1.1 GB)"}


def command(args: argparse.Namespace, config: Config) -> int:
    target = config_target()
    if target.exists() and not args.force:
        print(f"pincer: error: {target} exists already: `pincer setup --force` replaces it (secrets.env keeps "
              "its other lines), or `pincer channels add NAME` adds a chat app to it", file=sys.stderr)
        return 1
    asker = Asker(accept_defaults=args.yes)
    try:
        values, secrets, said = _model(args, asker)
        owner = asker.text("Your name (the agent is told whom it works for; empty: none)", flag="--owner",
                           given=args.owner if args.owner is not None or asker.interactive else "", default="")
        channel = _channel(args, asker, config)
    except Unanswered as exc:
        print(f"pincer: error: {exc}", file=sys.stderr)
        return 2
    except (PlatformRefused, PlatformAway, TimeoutError) as exc:
        print(f"pincer: error: {refusal(exc)}; nothing was saved", file=sys.stderr)
        return 1
    if owner:
        from brain.config import DEFAULT_INSTRUCTIONS

        values.setdefault("brain", {})["instructions"] = f"{DEFAULT_INSTRUCTIONS} The person you work for is {owner}."
    if channel is not None:
        values["channels"] = {channel.name: channel.settings}
        secrets.update(channel.secrets)
        said.append(f"{channel.name} as {channel.who} (the credentials work)")
    where = store_secrets(secrets) if secrets else None
    write_config(target, values, command="setup")
    print(f"wrote {target}: {'; '.join(said)}")
    if where:
        print(f"secrets in {where} (0600): {', '.join(secrets)}")
    note = outranked(config.source)
    if note:
        print(note, file=sys.stderr)
    print("next: `pincer up` runs it; `pincer channels add NAME` adds a chat app; every other key is in the "
          "packaged defaults")
    return 0


def _model(args: argparse.Namespace, asker: Asker) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The brain section's answers, the secrets they bring, and what to say of them."""
    kind = _kind(args, asker)
    if kind == LOCAL:
        return {"brain": {"model": LOCAL}}, {}, ["the local model (no key; its first start fetches it)"]
    if kind == SERVER:
        base = asker.text("The server's URL (its OpenAI API root)", flag="--api-base", given=args.api_base,
                          default="http://127.0.0.1:11434/v1",
                          check=lambda url: None if url.startswith(("http://", "https://")) else "an http(s) URL")
        model = asker.text("The model's name on that server (llama3.2, qwen2.5-coder, ...)", flag="--model",
                           given=args.model)
        model = model if "/" in model else f"openai/{model}"
        key = asker.secret("server's API key", flags="--api-key-file PATH or --api-key-env VAR",
                           from_file=args.api_key_file, from_env=args.api_key_env, optional=True)
        return ({"brain": {"model": model, "api_base": base}}, {"PINCER_LLM_API_KEY": key} if key else {},
                [f"model {model} at {base}" + (" (its key in secrets.env)" if key else "")])
    variable, default_model, shown = PROVIDERS.get(kind, (re.sub(r"\W", "_", kind.upper()) + "_API_KEY", "", kind))
    if args.model:  # a provider's name alone means its usual model
        model = default_model if args.model.lower() in PROVIDERS else args.model
    else:
        model = asker.text(f"{shown} model", flag="--model", default=default_model)
    key = ""
    if args.api_key_file or args.api_key_env or not os.environ.get(variable):
        key = asker.secret(f"{shown} API key ({variable})", flags="--api-key-file PATH or --api-key-env VAR",
                           from_file=args.api_key_file, from_env=args.api_key_env)
    kept = f"its key as {variable} in secrets.env" if key else f"its key from {variable} in the environment"
    return {"brain": {"model": model}}, {variable: key} if key else {}, [f"model {model} ({kept})"]


def _kind(args: argparse.Namespace, asker: Asker) -> str:
    """local, server, or the provider's name (from --model's prefix, else asked)."""
    if args.local_model or args.model == LOCAL:
        return LOCAL
    if args.api_base:
        return SERVER
    if args.model:
        provider, slash, _ = str(args.model).partition("/")
        if not slash and provider.lower() not in PROVIDERS:
            raise Unanswered(f"--model {args.model}: write PROVIDER/MODEL (openai/gpt-4o-mini), a provider's name "
                             f"({', '.join(PROVIDERS)}), or with --api-base the model's name on that server")
        return provider.lower()
    return asker.choice("The model the agent thinks with:", MODEL_CHOICES, flag="--model PROVIDER[/MODEL] (with "
                        "--api-key-env VAR or --api-key-file PATH), --api-base URL --model NAME, or --local-model")


def _channel(args: argparse.Namespace, asker: Asker, config: Config) -> Answered | None:
    name = args.channel
    if name is None:
        if not asker.interactive or asker.accept_defaults:
            return None
        name = asker.text(f"A chat app to reach the agent on now ({', '.join(KNOWN)}; empty: none, "
                          "`pincer channels add` later)", flag="--channel",
                          default="", check=lambda a: None if a in ("", *KNOWN) else f"one of {', '.join(KNOWN)}")
        if not name:
            return None
    return ask_channel(name, args, asker, config)


def _setup_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("the model (one of)")
    model.add_argument("--model", metavar="MODEL", help="a provider (openai, anthropic, gemini, groq) or a litellm "
                       "model string (anthropic/claude-3-5-haiku-latest); with --api-base, the server's model")
    model.add_argument("--api-key-env", metavar="VAR", help="the environment variable holding the provider's key")
    model.add_argument("--api-key-file", metavar="PATH", help="... or a file holding it")
    model.add_argument("--api-base", metavar="URL", help="a local OpenAI-compatible server's root "
                       "(http://127.0.0.1:11434/v1)")
    model.add_argument("--local-model", action="store_true", help="the local model: no key, runs on this machine")
    parser.add_argument("--owner", metavar="NAME", help="your name: the agent is told whom it works for")
    parser.add_argument("--channel", choices=KNOWN, help="a chat app to enable now (its credentials: the flags "
                        "below; checked against the platform before anything is saved)")
    parser.add_argument("-y", "--yes", action="store_true", help="take every default without asking")
    parser.add_argument("--force", action="store_true", help="replace the data dir's config.yaml if there is one")
    add_arguments(parser)


ARGUMENTS = {"setup": _setup_arguments}
