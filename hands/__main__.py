import sys

from bus.config import load_config
from hands.main import main

sys.exit(main(load_config()))
