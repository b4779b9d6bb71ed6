#!/usr/bin/env python3
"""CPU cost of authenticating one shared-tier value, per value size: the tag every offer computes and
every shared hit checks (``shadefs.cache.shared.value_tag``: HMAC-SHA256 under the group secret), against
the xxh3_64 checksum of the unauthenticated format and keyed BLAKE2b (hashlib), the other keyed hash the
standard library offers. One thread, best of ``--repeat`` timeit runs, microseconds per value.

Usage::

    bench_shared_tag.py [--sizes 40000,1048576] [--repeat 5]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import timeit

import xxhash

from shadefs.cache.shared import value_tag


def measure(size: int, repeat: int) -> dict:
    secret = os.urandom(32)
    data = os.urandom(size)
    key = "0" * 32
    ident = b"class/0001.jpg\0" + str(size).encode() + b"\0" + b"1700000000000000000\0" + b"0" * 16
    number = max(3, int(50e6 // max(size, 1)))  # about 50 MB hashed per run
    cases = {
        "xxh3_64 (unauthenticated checksum)": lambda: xxhash.xxh3_64_intdigest(data),
        "HMAC-SHA256 (value_tag)": lambda: value_tag(secret, "1ccd894a825f641a", key, ident, data),
        "keyed BLAKE2b-256 (hashlib)": lambda: hashlib.blake2b(data, key=secret, digest_size=32).digest(),
    }
    return {name: min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6 for name, fn in cases.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="40000,1048576", help="value sizes in bytes, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",")]
    rows = {s: measure(s, a.repeat) for s in sizes}
    names = list(next(iter(rows.values())))
    print("| per value | " + " | ".join(f"{s:,} B" for s in sizes) + " |")
    print("|---|" + "--:|" * len(sizes))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{rows[s][n]:.1f} us ({s / rows[s][n] / 1e3:.2f} GB/s)" for s in sizes)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
