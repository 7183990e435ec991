"""The commands that run Pincer's processes: up, stop, restart, service, logs, and each role on its own."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bus.config import Config, ConfigError
from gateway.channels.config import KNOWN as KNOWN_CHANNELS

if TYPE_CHECKING:
    from gateway.runtime.daemon import StateFile


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
    return Supervisor(config, hands=args.hands, env=env, argv=argv, local_model=args.local_model).run()


def stop(args: argparse.Namespace, config: Config) -> int:
    from gateway.runtime.daemon import StateFile, detach, stop

    data_dir = config.runtime.data_path
    if getattr(args, "rolling", False):
        return rolling_restart(StateFile(data_dir), timeout_s=args.timeout or 600.0)
    timeout = args.timeout if args.timeout is not None else config.redis.drain_timeout_s + 20
    was = StateFile(data_dir).read()  # before stop removes it: restart starts it as it was started
    code = stop(data_dir, timeout_s=timeout)
    if args.command == "stop" or code != 0:
        return code
    env = dict(os.environ)
    if config.source is not None:
        env["PINCER_CONFIG"] = str(Path(config.source).resolve())
    return detach(was.argv if was else ["up"], data_dir=data_dir, log_dir=config.runtime.logs_path, env=env)


def rolling_restart(state_file: StateFile, *, timeout_s: float) -> int:
    """Ask the running `pincer up` to restart its processes one at a time (SIGUSR1), and follow it."""
    import signal
    import time

    state = state_file.running()
    if state is None:
        print("pincer is not running here (start it with `pincer up --detach`)", file=sys.stderr)
        return 1
    rolled, said = state.rolled, ""
    os.kill(state.supervisor.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = state_file.running()
        if now is None:
            print("pincer: error: pincer stopped during the rolling restart (see `pincer logs`)", file=sys.stderr)
            return 1
        if now.rolled > rolled:
            print("rolling restart done: every process restarted, one at a time", file=sys.stderr)
            return 0
        if now.rolling.startswith("stopped"):
            print(f"pincer: error: rolling restart {now.rolling}", file=sys.stderr)
            return 1
        if now.rolling and now.rolling != said:
            said = now.rolling
            print(said, file=sys.stderr)
        time.sleep(0.2)
    print(f"pincer: error: the rolling restart did not finish within {timeout_s:g}s", file=sys.stderr)
    return 1


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


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hands", type=int, default=1, metavar="N", help="Hands workers to start (default 1)")
    parser.add_argument("-d", "--detach", action="store_true",
                    help="run in the background; return once the stack is ready")
    parser.add_argument("--local-model", action="store_true",
                    help="chat with a small model on this machine, no key needed (brain.model: local); the first "
                    "start fetches ~1.1 GB and builds llama.cpp's bindings (~5 min), later starts are offline")
    parser.add_argument("--listen", metavar="ADDR", help="the embedded Redis also on ADDR, for Hands workers on other "
                    "hosts (TLS only: needs redis.tls_cert_file and redis.tls_key_file)")


def _stop_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds before what is left is killed "
                      "(default: redis.drain_timeout_s + 20)")


def _restart_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, metavar="S", help="as for stop (with --rolling: for the whole "
                        "restart, default 600)")
    parser.add_argument("--rolling", action="store_true", help="restart each process in turn while the rest "
                        "serve (each drains first; a pool upgraded in place takes the new code, no turn lost)")


def _service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["install", "uninstall"])
    parser.add_argument("--dry-run", action="store_true", help="print the units instead of writing them")
    parser.add_argument("--system", action="store_true", help="system units in /etc/systemd/system (root)")
    parser.add_argument("--hands", type=int, default=1, metavar="N", help="Hands workers pincer.service starts")
    parser.add_argument("--local-model", action="store_true", help="pincer.service runs `pincer up --local-model`")
    parser.add_argument("--run-as", metavar="USER", help="--system: the unprivileged user the units run as "
                         "(default: the one who ran sudo; never root)")


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["serve"])
    served = parser.add_mutually_exclusive_group()
    served.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (the default)")
    served.add_argument("--http", type=int, metavar="PORT",
                        help="serve streamable HTTP at http://HOST:PORT/mcp; every request needs a Pincer token")
    parser.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on (127.0.0.1)")
    parser.add_argument("--agent", default="main", help="whose tools: the policy of this agent applies (default main)")
    parser.add_argument("--sender", default="mcp", help="the sender the tool policy sees (owner_only tools)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="longest a call may take (120)")
    parser.add_argument("--redis", metavar="URL")


def _logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument("--role", help="one role: gateway, brain, hands-1, model, supervisor, ...")
    parser.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="last N lines of each (default 50)")


def _hands_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL", help="Redis URL (default: redis.url or the local `pincer up`)")
    parser.add_argument("--concurrency", type=int, metavar="N", help="calls this worker runs at once")


def _brain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL")


def _gateway_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL")
    parser.add_argument("--port", type=int)


def _channel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=KNOWN_CHANNELS)
    parser.add_argument("--redis", metavar="URL")


ARGUMENTS = {
    "up": _up_arguments,
    "stop": _stop_arguments,
    "restart": _restart_arguments,
    "service": _service_arguments,
    "mcp": _mcp_arguments,
    "logs": _logs_arguments,
    "hands": _hands_arguments,
    "brain": _brain_arguments,
    "gateway": _gateway_arguments,
    "channel": _channel_arguments,
}
