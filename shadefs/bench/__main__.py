"""``python -m shadefs.bench NAME [options]``: run benchmark NAME; ``--list``: the benchmarks and their questions."""
import sys

from shadefs.bench.runner import main

sys.exit(main())
