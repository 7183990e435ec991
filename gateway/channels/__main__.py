"""``python -m gateway.channels NAME``: one chat channel's process (as `pincer up` starts it)."""

import sys

from bus.service import start_role
from gateway.channels.main import main

name = sys.argv[1] if len(sys.argv) > 1 else ""
sys.exit(start_role(name or "channel", lambda config: main(config, name)))
