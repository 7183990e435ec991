import sys

from brain.main import main
from bus.config import load_config

sys.exit(main(load_config()))
