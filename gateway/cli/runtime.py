"""The commands that run Pincer's processes: up, stop, restart, service, logs, and each role on its own."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from bus.config import Config, ConfigError


def validate_all(config: Config) -> None:
    """Check every section now, so a bad value stops start-up before any process runs."""
    from brain.config import BrainSettings
    from gateway.channels.config import ChannelSettings
    from gateway.config import GatewaySettings
    from gateway.runtime.supervisor import listen_tls
    from hands.config import HandsSettings, check_workspace

    config.redis, config.runtime  # noqa: B018 - validated on access
    listen_tls(config.redis)
    check_workspace(config.section("hands", HandsSettings), data_dir=config.runtime.data_path)
    config.section("brain", BrainSettings)
    config.section("gateway", GatewaySettings)
    config.section("channels", ChannelSettings)


def up(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.supervisor import Supervisor

    if args.hands < 1:
        raise ConfigError("--hands must be at least 1")
    validate_all(config)
    env = dict(os.environ)
    if config.source is not None:
        env["PINCER_CONFIG"] = str(Path(config.source).resolve())
    argv = ["up", "--hands", str(args.hands), *(["--local-model"] if args.local_model else [])]
    if args.detach:
        from brain.config import BrainSettings
        from brain.llm import LOCAL
        from gateway.runtime.daemon import detach

        # A first local-model start installs and fetches for minutes: wait that long for it.
        local = args.local_model or config.section("brain", BrainSettings).model == LOCAL
        return detach(argv, data_dir=config.runtime.data_path, log_dir=config.runtime.logs_path, env=env,
                      **({"timeout_s": 1800} if local else {}))
    return asyncio.run(Supervisor(config, hands=args.hands, env=env, argv=argv, local_model=args.local_model).run())


def stop(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.daemon import StateFile, detach, stop

    data_dir = config.runtime.data_path
    timeout = args.timeout if args.timeout is not None else config.redis.drain_timeout_s + 20
    was = StateFile(data_dir).read()  # before stop removes it: restart starts it as it was started
    code = stop(data_dir, timeout_s=timeout)
    if args.command == "stop" or code != 0:
        return code
    env = dict(os.environ)
    if config.source is not None:
        env["PINCER_CONFIG"] = str(Path(config.source).resolve())
    return detach(was.argv if was else ["up"], data_dir=data_dir, log_dir=config.runtime.logs_path, env=env)


def service(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime import service as units

    if args.action == "uninstall":
        return units.uninstall(system=args.system)
    validate_all(config)
    source = Path(config.source).resolve() if config.source and args.config else None
    return units.install(hands=args.hands, system=args.system, dry_run=args.dry_run,
                         stop_timeout_s=int(config.redis.drain_timeout_s + 30), config=source,
                         local_model=args.local_model, run_as=args.run_as)


def logs(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.logfiles import show_logs

    return show_logs(config.runtime.logs_path, role=args.role, lines=args.lines, follow=args.follow)


def hands(args: argparse.Namespace, config: Config) -> int:
    from hands.main import main as hands_main

    validate_all(config)
    return hands_main(config, concurrency=args.concurrency)


def brain(args: argparse.Namespace, config: Config) -> int:
    from brain.main import main as brain_main
    from gateway.config import GatewaySettings

    validate_all(config)
    return brain_main(config, rate=config.section("gateway", GatewaySettings).limits.rate())


def gateway(args: argparse.Namespace, config: Config) -> int:
    from gateway.server.main import main as gateway_main

    validate_all(config)
    return gateway_main(config, port=args.port)


def channel(args: argparse.Namespace, config: Config) -> int:
    from gateway.channels.main import main as channel_main
    from hands.config import configured_workspaces

    validate_all(config)
    return channel_main(config, args.name, workspaces=configured_workspaces(config))


def mcp(args: argparse.Namespace, config: Config) -> int:
    from gateway.server.mcp_serve import main as serve_mcp

    return serve_mcp(config, agent_id=args.agent, sender=args.sender, call_timeout_s=args.timeout,
                     http=(args.host, args.http) if args.http is not None else None)
