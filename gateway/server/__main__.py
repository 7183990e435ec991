"""``python -m gateway.server``: the Gateway's HTTP server, as `pincer up` starts it."""

import sys

from bus.service import start_role
from gateway.server.main import main

sys.exit(start_role("gateway", main))
