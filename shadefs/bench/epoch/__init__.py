"""Epoch time of a DataLoader(ImageFolder, num_workers=4) over slow storage, with and without shadefs.

Regime: **page cache** (the readers' memory is not bounded: the kernel may keep what a worker read).
Limit: ``local disk`` (ImageFolder on a local copy) and the GETs/s moto sustains through the proxy (the
physical-limit probe).

What runs (each a fresh training process, the same model, seed, batch size and sample order):

- ``direct S3``: no shadefs. A plain ImageFolder cannot read ``s3://``, so this is the FUSE-less
  reader a user would write: a torch Dataset listing the prefix once (s3fs ``find``) and reading each
  sample with ONE GET (s3fs ``cat_file``, ``max_concurrency=1``, the call shadefs's fsspec backend makes
  on a miss; the default obstore backend makes the same one GET), decoded like ImageFolder (``PIL.Image.open(...).convert("RGB")``). Each DataLoader
  worker opens its own s3fs client after the fork.
- ``direct S3, obstore`` (``--configs direct-obstore``): the same reader with obstore's ``get`` on an
  ``S3Store`` per worker instead of s3fs (the client shadefs's default backend uses).
- ``shadefs lru`` / ``shadefs static``: ``shadefs mount s3://... --policy P --ram-cache C%`` and an
  unmodified ImageFolder on the mount, ``shuffle=True``.
- ``shadefs shade + hook``: ``--policy shade`` and the training hook (``ShadeSampler`` +
  ``ScoreReporter`` from ``shadefs.hooks``, as ``train_fashion_mnist.py --hook``).
- ``local disk``: ImageFolder on the local copy of the same files (page cache warm: the limit).

at RAM-tier sizes of ``--sizes`` percent of the dataset's bytes. Every shadefs run mounts fresh (cold
cache), records ``shadefs stats --json`` after every epoch, and unmounts.

The slow storage: moto's S3 server (``python -m moto.server``) on loopback, behind
``shadefs/testing/latency_proxy.py``, a TCP proxy adding a fixed one-way delay per direction and a rate limit
per direction (the stand-in for ``tc qdisc ... netem delay 1ms rate 1gbit`` where the kernel lacks
``sch_netem``). The proxy settings and the GET latency measured through it are printed with the
results.

The data: the first ``--train-limit`` Fashion-MNIST training images, upscaled to 224x224 RGB, with
Gaussian pixel noise (``--noise``) and JPEG quality ``--quality``, so that files are tens of KB rather
than the 5.5 KB of a clean upscaled image (make_fashion_mnist.py ``--size 224 --format jpeg``).

The model: a small CNN on 64x64 inputs (``transforms.Resize(64)``); the point is I/O, not compute.

Usage::

    python -m shadefs.bench epoch [--quick] [--train-limit N] [--epochs E] [--sizes 10,20,40]
                   [--configs direct,local,lru,static,shade] [--delay-ms 1] [--rate 1gbit]
                   [--repeat N] [--no-limit] [--baseline REV]
                   [--workdir DIR] [--json OUT.json] [--write-doc]
    python -m shadefs.bench epoch --results OUT.json --write-doc      # re-render the doc from a saved run

``--write-doc`` replaces the section between ``<!-- bench_epoch:start -->`` and
``<!-- bench_epoch:end -->`` in docs/results/epoch.md and writes docs/img/bench_epoch.png.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile

from shadefs.bench.epoch.configs import CONFIG_ORDER, DEFAULT_CONFIGS, log
from shadefs.bench.epoch.measure import merge_results, run_benchmark
from shadefs.bench.epoch.report import DOC, PLOT, cpu_table, findings, table, write_doc

# The package's parts: configs (the runs and their labels), measure (dataset, moto and the proxy, the
# physical limit, the mounts and the runs), child (one training run, its own process), report (tables,
# plot, findings, the doc section).


#: the runner's common options this benchmark honours
COMMON = ('baseline', 'write_doc', 'json')


def add_arguments(p) -> None:
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="training images (default 2000; --quick: 400)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (default 3; --quick: 2)")
    p.add_argument("--sizes", default=None, help="RAM-tier sizes, %% of the dataset (default 10,20,40; "
                                                 "--quick: 20)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="which runs: direct,local,lru,static,shade,plan,shade-noplan (default), and "
                   "direct-obstore (the direct reader on obstore instead of s3fs), "
                   "lru-fsspec,static-fsspec (--backend fsspec), lru-base,static-base (--baseline REV)")
    p.add_argument("--quick", action="store_true", help="a ~2 minute validation run")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the whole list of configs N times, round after round (load swings hit all)")
    p.add_argument("--no-limit", action="store_true", help="skip the physical-limit probe (about a minute)")
    p.add_argument("--delay-ms", type=float, default=1.0, help="proxy: one-way delay per direction")
    p.add_argument("--rate", default="1gbit", help="proxy: rate per direction (0 = unlimited)")
    p.add_argument("--proxy-mode", choices=("http", "tcp"), default="http",
                   help="proxy: http keeps client connections alive (default; moto closes every "
                        "connection, S3 does not); tcp: plain pipe")
    p.add_argument("--noise", type=float, default=32.0,
                   help="std of the Gaussian pixel noise added before JPEG encoding (default 32)")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality (default 95)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    p.add_argument("--image-size", type=int, default=64, help="transforms.Resize target (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "shadefs-bench-epoch"))
    p.add_argument("--limit-clients", type=int, default=32,
                   help="clients of the physical-limit probe (default 32, the prefetch concurrency)")
    p.add_argument("--run-timeout", type=float, default=1800, help="seconds per training run")
    p.add_argument("--results", metavar="IN.json", nargs="+",
                   help="render from saved results (several: chunks of one grid, merged); run nothing")


def run(a, bench):
    a.train_limit = a.train_limit or (400 if a.quick else 2000)
    a.epochs = a.epochs or (2 if a.quick else 3)
    a.sizes = [int(s) for s in (a.sizes or ("20" if a.quick else "10,20,40")).split(",") if s]
    a.configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = set(a.configs) - set(CONFIG_ORDER)
    if bad:
        bench.error(f"--configs: unknown {sorted(bad)}")
    if any(c.endswith("-base") for c in a.configs) and not a.baseline:
        bench.error("--configs lru-base/static-base need --baseline REV")
    if a.epochs < 1 or a.train_limit < 1 or not a.sizes or any(not 0 < s <= 100 for s in a.sizes):
        bench.error("--epochs, --train-limit must be >= 1 and --sizes in 1..100")

    def _term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    if a.results:
        results = merge_results(a.results)
    else:
        try:
            results = run_benchmark(a, bench)
        except KeyboardInterrupt:
            log("interrupted: mounts unmounted, moto and the proxy stopped")
            return 130
        out = a.json or os.path.join(a.workdir, "results.json")
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
        log(f"results in {out}")
    print(results["proxy"]["settings"])
    p = results["probe"]
    print(f"GET latency median: moto {p['moto']['median_ms']:.1f} ms, via proxy {p['proxy']['median_ms']:.1f} ms")
    print(table(results))
    print()
    print(cpu_table(results))
    for s in findings(results):
        print("- " + s)
    print(f"load average: start {results['load_start'][0]:.2f}, end {results['load_end'][0]:.2f}; "
          f"total {results['total_s']:.0f} s")
    if a.write_doc:
        write_doc(results)
        log(f"wrote {DOC} and {PLOT}")
    return 0
