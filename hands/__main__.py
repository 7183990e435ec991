"""``python -m hands``: one Hands worker, as `pincer up` starts it."""

import sys

from bus.service import start_role
from hands.main import main

sys.exit(start_role("hands", main))
