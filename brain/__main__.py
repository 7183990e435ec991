"""``python -m brain``: one Brain, as `pincer up` starts it."""

import sys

from brain.main import main
from bus.config import Config
from bus.service import start_role
from gateway.config import GatewaySettings


def run(config: Config) -> int:
    return main(config, rate=config.section("gateway", GatewaySettings).limits.rate())


sys.exit(start_role("brain", run))
