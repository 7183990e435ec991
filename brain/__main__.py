"""``python -m brain``: one Brain, as `pincer up` starts it."""

import sys

from brain.main import main
from bus.service import start_role

sys.exit(start_role("brain", main))
