"""``pincer open``: the chat page in a browser, signed in by a one-time link whose code never rides on a
command line (any local user reads those in /proc)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bus.config import Config, ConfigError
from gateway.cli.credentials import gateway_arguments


def open_page(base_url: str, token: str | None, *, only_print: bool, data_dir: Path) -> int:
    """Ask the Gateway for a one-time sign-in link; open it in a browser where there is one.

    The link's code never rides on a command line (any local user reads those in /proc): the browser
    is given a private file that forwards to the link."""
    import webbrowser

    import httpx

    if not token:
        print("pincer: error: no token to sign in with: set PINCER_TOKEN, or run `pincer up` "
              "(it makes the owner's token)", file=sys.stderr)
        return 1
    try:
        made = httpx.post(f"{base_url.rstrip('/')}/v1/login-links", headers={"Authorization": f"Bearer {token}"},
                          timeout=10)
    except httpx.HTTPError as exc:
        print(f"pincer: error: cannot reach the Gateway at {base_url}: {exc}", file=sys.stderr)
        return 1
    if made.status_code != 200:
        print(f"pincer: error: the Gateway refused ({made.status_code}): {made.text[:300]}", file=sys.stderr)
        return 1
    link = f"{base_url.rstrip('/')}{made.json()['path']}"
    if only_print:
        print(link)
        print(f"(works once, for {made.json()['expires_in']}s)", file=sys.stderr)
        return 0
    forwarder = sign_in_file(data_dir, link)
    if not webbrowser.open(forwarder.as_uri()):
        print(f"no browser found here: open this link in one (it works once, for {made.json()['expires_in']}s):\n"
              f"{link}", file=sys.stderr)
    return 0


def sign_in_file(data_dir: Path, link: str) -> Path:
    """A page only this user can read (0600, in a 0700 folder) that sends the browser on to ``link``;
    an earlier one is removed (its code was used or has expired)."""
    import html
    import secrets

    from bus.private_file import write_private

    folder = Path(data_dir).expanduser() / "sign-in"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.is_symlink() or not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of this user's; remove it and run `pincer open` again")
    folder.chmod(0o700)
    for old in folder.glob("*.html"):
        old.unlink(missing_ok=True)
    target = html.escape(link, quote=True)
    page = folder / f"{secrets.token_hex(8)}.html"
    write_private(page, f'<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
                        f'<meta http-equiv="refresh" content="0;url={target}"><title>Pincer</title>'
                        f'<p>Signing in to <a href="{target}">Pincer</a>…</p>\n')
    return page


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.credentials import caller_token
    from gateway.config import GatewaySettings

    settings = config.section("gateway", GatewaySettings)
    return open_page(args.url or settings.url, caller_token(args, config, settings), only_print=args.print,
                     data_dir=config.runtime.data_path)


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _open_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print", action="store_true", help="only print the link (for another machine's browser)")
    gateway_arguments(parser)


ARGUMENTS = {"open": _open_arguments}
