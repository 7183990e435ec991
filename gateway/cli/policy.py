"""``pincer policy explain TOOL``: why a tool is (not) allowed for an agent and a sender, and for exec
the approvals that apply: the mode, the operator's allowlist, and the always-rules that cover the sender
(who allowed each, and when)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime
from typing import Any

from bus.config import Config
from gateway.cli.connect import connected_bus
from hands.approvals import remembered
from hands.config import HandsSettings
from hands.errors import ToolFailure
from hands.toolpolicy import ToolPolicy
from hands.worker import load_registry


def explain(config: Config, tool_name: str, *, agent: str, sender: str) -> int:

    settings = config.section("hands", HandsSettings)
    registry, _ = load_registry(settings)
    try:
        tool = registry.get(tool_name)
    except ToolFailure as exc:
        from hands.mcp.servers import configured_tool

        found = configured_tool(settings.mcp, tool_name)
        if found is None:
            print(f"pincer: error: {exc.message}", file=sys.stderr)
            return 1
        tool = found
    decision = ToolPolicy(settings.tools).decide(tool, agent=agent, sender=sender)
    print(f"{tool.name} ({tool.category.value}) for agent {agent!r}, sender {sender or '(unknown)'!r}:")
    for step in decision.trace:
        print(f"  - {step}")
    print(("ALLOWED: " if decision.allowed else "DENIED: ") + decision.rule)
    if tool.name == "exec" and decision.allowed:
        return _explain_exec(config, settings, agent=agent, sender=sender)
    return 0


def _explain_exec(config: Config, settings: Any, *, agent: str, sender: str) -> int:
    """What exec approvals add: the mode, the operator's allowlist, and the always-rules covering the sender."""
    exec_settings = settings.exec
    print(f"commands: hands.exec.mode {exec_settings.mode}")
    if exec_settings.mode in ("full", "deny"):
        return 0
    for entry in exec_settings.allowlist:
        print(f"  - allowed for everyone (hands.exec.allowlist): {entry.path}"
              + (f" with arguments matching {entry.args}" if entry.args else ""))

    async def rules() -> list[Any]:
        async with connected_bus(config) as bus:
            return await remembered(bus, agent, sender)

    try:
        found = asyncio.run(rules())
    except Exception as exc:  # redis-py's connection and auth errors
        print(f"pincer: error: cannot reach Redis for the always-rules: {exc}", file=sys.stderr)
        return 1
    if not sender:
        print("  (no --sender: always-rules cover one identity each; name one to see its rules)")
    for rule in found:
        when = datetime.fromtimestamp(rule.at / 1000).strftime("%Y-%m-%d %H:%M")
        print(f"  - allowed for {rule.covers} only on agent {agent!r} (allow-always by {rule.by}, {when}): "
              f"{rule.entry.path}" + (f" with exactly arguments {rule.entry.args}" if rule.entry.args else ""))
    return 0


def command(args: argparse.Namespace, config: Config) -> int:
    return explain(config, args.tool, agent=args.agent, sender=args.sender)


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["explain"])
    parser.add_argument("tool")
    parser.add_argument("--agent", default="main")
    parser.add_argument("--sender", default="")


ARGUMENTS = {"policy": _policy_arguments}
