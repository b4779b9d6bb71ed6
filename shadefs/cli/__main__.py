"""``python -m shadefs.cli ...``: the ``shadefs`` command (as ``python -m shadefs``)."""
import sys

from . import main

sys.exit(main())
