"""`pincer backup` and `pincer restore`: one verified archive of everything Pincer keeps, taken while the
pool runs, and brought back into a fresh data dir and Redis (gateway/runtime/backup.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bus.config import Config, ConfigError
from bus.errors import PincerError
from bus.progress import for_stream
from bus.service import redis_url
from bus.streams import Bus
from gateway.runtime.backup import BackupError, Places, prune, restore, verify, write


def _places(config: Config) -> Places:
    from hands.config import HandsSettings, identity_root

    hands = config.section("hands", HandsSettings)
    return Places(data=config.runtime.data_path, workspace=hands.workspace.expanduser(),
                  identities=identity_root(hands))


def _say(line: str) -> None:
    print(f"pincer: {line}", file=sys.stderr)


def backup(args: argparse.Namespace, config: Config) -> int:
    from gateway.server.hooks import HookStore

    async def scrub(copy: Bus) -> None:
        await HookStore(copy.redis, copy.keys).forget_secrets()

    folder = Path(args.dir).expanduser() if args.dir else config.runtime.data_path / "backups"
    try:
        url = args.redis or redis_url(config)
        path = asyncio.run(write(url, config.redis.prefix, _places(config), folder, secrets=args.with_secrets,
                                 scrub=scrub, say=_say, sink=for_stream(sys.stderr, _say, prefix="pincer: ")))
        manifest = verify(path)
        gone = prune(folder, args.keep) if args.keep else []
    except (PincerError, OSError) as exc:
        print(f"pincer: error: backup failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"archive": str(path), "manifest": manifest, "pruned": [str(p) for p in gone]}, indent=2))
        return 0
    print(path)
    left = f"; left out: {', '.join(manifest['left_out'])} (--with-secrets keeps them)" if manifest["left_out"] else ""
    _say(f"written and verified: {manifest['redis']['keys']:,} keys, {len(manifest['files']):,} files{left}"
         + (f"; removed {len(gone)} older archive(s)" if gone else ""))
    return 0


def restore_command(args: argparse.Namespace, config: Config) -> int:
    path = Path(args.archive).expanduser()
    try:
        if args.verify_only:
            manifest = verify(path)
            print(json.dumps(manifest, indent=2) if args.json else
                  f"{path.name}: verified ({manifest['redis']['keys']:,} keys, {len(manifest['files']):,} files, "
                  f"written by pincer {manifest['pincer']} at {manifest['created_at']})")
            return 0
        manifest = asyncio.run(_restore(path, config, args.redis))
    except (PincerError, OSError) as exc:
        print(f"pincer: error: restore failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        _say(f"restored {manifest['redis']['keys']:,} keys and {len(manifest['files']):,} files from "
             f"{manifest['created_at']}; start it with `pincer up`")
        if not manifest["secrets"]:
            _say("the archive kept no secrets: put the model's key and channel tokens back (`pincer setup`), and "
                 "rotate each signed webhook (`pincer hooks rotate NAME`)")
    return 0


async def _restore(path: Path, config: Config, url: str | None) -> dict[str, object]:
    """Into the Redis given or configured, else into the embedded Redis of the data dir (started for it)."""
    from bus.redis_server import EmbeddedRedis

    embedded = None
    if url is None:
        try:
            url = redis_url(config)
        except ConfigError:
            verify(path)  # before starting anything
            embedded = EmbeddedRedis(config.runtime.data_path)
            url = embedded.start()
    bus = Bus.from_settings(config.redis.model_copy(update={"sentinels": []}), url)
    try:
        return await restore(path, bus, _places(config), say=_say,
                             sink=for_stream(sys.stderr, _say, prefix="pincer: "))
    except BackupError:
        raise
    finally:
        await bus.close()
        if embedded is not None:
            embedded.stop()


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _backup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", help="where the archive goes (default: <data dir>/backups)")
    secrets = parser.add_mutually_exclusive_group()
    secrets.add_argument("--with-secrets", action="store_true",
                         help="keep secrets.env, the owner token, Redis's password, the Matrix keys and the "
                              "webhooks' secrets too (keep such an archive as safe as the machine)")
    secrets.add_argument("--no-secrets", dest="with_secrets", action="store_false",
                         help="leave every secret out (the default)")
    parser.add_argument("--keep", type=int, default=0, metavar="N",
                        help="then remove all but the newest N archives in DIR")
    parser.add_argument("--redis", metavar="URL", help="the Redis to back up (default: the configured one)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _restore_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archive", metavar="ARCHIVE", help="a pincer-backup-*.tar.gz")
    parser.add_argument("--verify-only", action="store_true", help="check the archive against its manifest; "
                        "change nothing")
    parser.add_argument("--redis", metavar="URL", help="the (empty) Redis to restore into (default: the "
                        "configured one, else the data dir's embedded Redis)")
    parser.add_argument("--json", action="store_true", help="print JSON")


ARGUMENTS = {"backup": _backup_arguments, "restore": _restore_arguments}
