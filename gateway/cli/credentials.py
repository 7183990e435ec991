"""The token a client command (`pincer chat`, `pincer open`) presents to the Gateway."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bus.config import Config, ConfigError

if TYPE_CHECKING:
    from gateway.config import GatewaySettings


def caller_token(args: argparse.Namespace, config: Config, settings: GatewaySettings) -> str | None:
    """The token a client command uses: --token-file, else $PINCER_TOKEN, else the owner's (as `pincer up` made it)."""
    return given_token(args.token_file) or os.environ.get("PINCER_TOKEN") or chat_token(config, settings)


def given_token(path: str | None) -> str | None:
    """The token in ``path`` ('-': standard input): a secret never rides on a command line."""
    if path is None:
        return None
    try:
        text = sys.stdin.readline() if path == "-" else Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--token-file {path}: cannot read it ({exc})") from None
    token = text.strip()
    if not token:
        raise ConfigError(f"--token-file {path}: it holds no token")
    return token


def chat_token(config: Config, settings: GatewaySettings) -> str | None:
    """The configured owner token, else the one `pincer up` made in the data dir."""
    from gateway.tokens import read_owner_token

    return settings.static_token() or read_owner_token(Path(config.runtime.data_dir))


def gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a client command finds the Gateway, and the token it shows there."""
    parser.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    parser.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE (as for `pincer chat`)")
