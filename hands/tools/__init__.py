"""Built-in tools."""

from __future__ import annotations

from hands.registry import ToolDefinition
from hands.tools.agents import AGENT_TOOLS
from hands.tools.ask import PERSON_TOOLS
from hands.tools.code import CODE_TOOLS
from hands.tools.files import FILE_TOOLS
from hands.tools.memory import MEMORY_TOOLS
from hands.tools.schedule import SCHEDULE_TOOLS
from hands.tools.web import WEB_TOOLS


def builtin_tools() -> list[ToolDefinition]:
    return [*FILE_TOOLS, *MEMORY_TOOLS, *SCHEDULE_TOOLS, *CODE_TOOLS, *WEB_TOOLS, *AGENT_TOOLS, *PERSON_TOOLS]
