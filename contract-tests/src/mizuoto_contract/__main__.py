"""``python -m mizuoto_contract [ENGINE ...] [-- PYTEST ARGS]``: run the contract suite."""

import sys

from mizuoto_contract import run

argv = sys.argv[1:]
split = argv.index("--") if "--" in argv else len(argv)
sys.exit(run(argv[:split], argv[split + 1:]))
