"""The benchmarks: ``python -m shadefs.bench --list`` names them and the question each answers;
``python -m shadefs.bench NAME [--rounds N] [--baseline REV] [--write-doc] [--json PATH] [options]`` runs one.

Each is a module here with a docstring (the question, the regime, the physical limit it is measured
against), ``add_arguments(parser)`` and ``run(args, bench)``; :mod:`shadefs.bench.runner` holds what they share.
"""
