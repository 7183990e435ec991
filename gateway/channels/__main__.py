"""``python -m gateway.channels NAME``: one chat channel's process (as `pincer up` starts it)."""

import sys

from bus.config import Config
from bus.service import start_role
from gateway.channels.main import main
from hands.config import configured_workspaces


def run(config: Config) -> int:
    return main(config, name, workspaces=configured_workspaces(config))


name = sys.argv[1] if len(sys.argv) > 1 else ""
sys.exit(start_role(name or "channel", run))
