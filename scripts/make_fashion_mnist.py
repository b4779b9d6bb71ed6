#!/usr/bin/env python3
"""Build a Fashion-MNIST ImageFolder tree for the shadefs demos and benchmarks.

Reads the gzip'd IDX files shipped by the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``) and writes::

    OUT/train/<class>/00000.png ... (60,000 files)
    OUT/test/<class>/00000.png  ... (10,000 files)
    OUT.complete                    (JSON marker beside OUT, written last)

File names are the index of the image within its split, zero-padded to five
digits. By default the files are 28x28 grayscale PNGs with the exact IDX
pixels; ``--size 224 --format jpeg`` writes SxS RGB JPEGs (quality 90) instead,
for benchmarks that want ImageNet-sized files.

The trees are built under ``OUT.partial`` and moved into place only when
complete, then the ``OUT.complete`` marker is written; a killed run is detected
and rebuilt on the next call. Marker and staging directory lie beside OUT, not
in it, so a mount of OUT shows only ``train/`` and ``test/``. A run whose marker and file counts already match
the request exits 0 at once. ``torchvision.datasets.ImageFolder`` should be
pointed at ``OUT/train`` or ``OUT/test``, never at ``OUT`` itself.

Usage::

    make_fashion_mnist.py OUT [--source DIR] [--limit-train N] [--limit-test N]
                              [--size S] [--format png|jpeg]
"""
from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time

import numpy as np
from PIL import Image

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"
NATIVE_SIZE = 28
JPEG_QUALITY = 90
PROCESSES = 2
CHUNK = 1000
MARKER = ".complete"   # suffix: OUT.complete, beside the tree
STAGING = ".partial"   # suffix: OUT.partial


def marker_path(out: str) -> str:
    """``OUT.complete``: the marker lies outside the tree, which is what gets mounted."""
    return os.path.normpath(os.path.abspath(out)) + MARKER


def staging_path(out: str) -> str:
    return os.path.normpath(os.path.abspath(out)) + STAGING

# Filesystem-safe class names, in label order (label i -> CLASSES[i]).
CLASSES = (
    "T-shirt_top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle_boot",
)

SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

# IDX type codes -> big-endian numpy dtypes.
_IDX_DTYPES = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_EXTENSIONS = {"png": ".png", "jpeg": ".jpg"}


def read_idx(path: str) -> np.ndarray:
    """Return the array stored in the IDX file at ``path`` (gzip'd or not).

    The header is two zero bytes, a type code, the number of dimensions, then
    one big-endian uint32 per dimension; the data follow, big-endian. The
    result is in native byte order.
    """
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise ValueError(
            f"{path}: expected {count * dtype.itemsize} data bytes for shape "
            f"{dims}, found {len(raw) - header}")
    data = np.frombuffer(raw, dtype, count, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def file_name(index: int, fmt: str) -> str:
    """Return the file name of image ``index`` of a split: ``00012.png``."""
    return f"{index:05d}{_EXTENSIONS[fmt]}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write Fashion-MNIST as ImageFolder trees OUT/train "
                    "and OUT/test from the Debian dataset-fashion-mnist IDX "
                    "files.")
    parser.add_argument("out", metavar="OUT", help="output directory")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help="directory holding the IDX .gz files "
                             "(default: %(default)s)")
    parser.add_argument("--limit-train", type=int, default=None, metavar="N",
                        help="keep only the first N training images")
    parser.add_argument("--limit-test", type=int, default=None, metavar="N",
                        help="keep only the first N test images")
    parser.add_argument("--size", type=int, default=NATIVE_SIZE, metavar="S",
                        help="side of the written images in pixels "
                             "(default: %(default)s, the native size)")
    parser.add_argument("--format", choices=sorted(_EXTENSIONS), default="png",
                        help="png: grayscale; jpeg: RGB, quality "
                             f"{JPEG_QUALITY} (default: %(default)s)")
    args = parser.parse_args(argv)
    for name in ("limit_train", "limit_test"):
        value = getattr(args, name)
        if value is not None and value < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.size < 1:
        parser.error("--size must be >= 1")
    return args


def count_files(split_dir: str) -> int:
    """Count the files in the class folders of ``split_dir``."""
    total = 0
    with os.scandir(split_dir) as classes:
        for entry in classes:
            if entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as files:
                    total += sum(1 for f in files if f.is_file())
    return total


def already_built(out: str, expected: dict) -> bool:
    """Return True if ``out`` holds a complete tree built with ``expected``."""
    try:
        with open(marker_path(out)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    if any(marker.get(key) != value for key, value in expected.items()):
        return False
    try:
        return all(count_files(os.path.join(out, split)) == expected[split]
                   for split in SPLITS)
    except OSError:
        return False


# Worker state, set once per process by _init_worker.
_W: dict = {}


def _init_worker(images: dict, labels: dict, root: str, size: int,
                 fmt: str) -> None:
    # The parent handles Ctrl-C and SIGTERM and terminates the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _W.update(images=images, labels=labels, root=root, size=size, fmt=fmt)


def _encode_chunk(task: tuple) -> tuple:
    """Write images ``start:stop`` of ``split``; return (count, bytes)."""
    split, start, stop = task
    images, labels = _W["images"][split], _W["labels"][split]
    root, size, fmt = _W["root"], _W["size"], _W["fmt"]
    written = 0
    for i in range(start, stop):
        img = Image.fromarray(images[i])
        if fmt == "jpeg":
            img = img.convert("RGB")
        if size != NATIVE_SIZE:
            img = img.resize((size, size), Image.Resampling.BICUBIC)
        path = os.path.join(root, split, CLASSES[labels[i]],
                            file_name(i, fmt))
        if fmt == "jpeg":
            img.save(path, format="JPEG", quality=JPEG_QUALITY)
        else:
            img.save(path, format="PNG")
        written += os.path.getsize(path)
    return stop - start, written


def load_labels(source: str, limits: dict) -> dict:
    """Read and check the (small) label files; return labels by split."""
    labels = {}
    for split, (_, label_file) in SPLITS.items():
        y = read_idx(os.path.join(source, label_file))
        if y.ndim != 1 or y.dtype != np.uint8:
            raise ValueError(f"{label_file}: unexpected labels "
                             f"{y.shape} {y.dtype}")
        if y.size and int(y.max()) >= len(CLASSES):
            raise ValueError(f"{label_file}: label {int(y.max())} "
                             "out of range")
        limit = limits[split]
        labels[split] = y if limit is None else y[:limit]
    return labels


def load_images(source: str, labels: dict) -> dict:
    """Read the image files; return the images matching ``labels`` by split."""
    images = {}
    for split, (image_file, _) in SPLITS.items():
        x = read_idx(os.path.join(source, image_file))
        n = len(labels[split])
        if x.ndim != 3 or x.dtype != np.uint8 or len(x) < n:
            raise ValueError(f"{image_file}: unexpected images "
                             f"{x.shape} {x.dtype}")
        images[split] = x[:n]
    return images


def build(out: str, images: dict, labels: dict, size: int, fmt: str) -> int:
    """Write the trees under OUT.partial with a process pool, then move them
    into place. Return the total number of bytes written."""
    staging = staging_path(out)
    shutil.rmtree(staging, ignore_errors=True)
    # markers and staging of older versions lay inside OUT (and so inside a mount of it)
    shutil.rmtree(os.path.join(out, STAGING), ignore_errors=True)
    if os.path.lexists(os.path.join(out, MARKER)):
        os.remove(os.path.join(out, MARKER))
    for split in SPLITS:
        for name in CLASSES:
            os.makedirs(os.path.join(staging, split, name))
    tasks = [(split, start, min(start + CHUNK, len(images[split])))
             for split in SPLITS
             for start in range(0, len(images[split]), CHUNK)]
    total_bytes = 0
    with multiprocessing.Pool(PROCESSES, _init_worker,
                              (images, labels, staging, size, fmt)) as pool:
        for _, nbytes in pool.imap_unordered(_encode_chunk, tasks):
            total_bytes += nbytes
    for split in SPLITS:
        final = os.path.join(out, split)
        if os.path.lexists(final):
            shutil.rmtree(final)
        os.rename(os.path.join(staging, split), final)
    os.rmdir(staging)
    return total_bytes


def check_replaceable(out: str) -> None:
    """Refuse to delete OUT/train or OUT/test unless they look like ours."""
    for split in SPLITS:
        path = os.path.join(out, split)
        if not os.path.lexists(path):
            continue
        if not os.path.isdir(path) or os.path.islink(path) \
                or not set(os.listdir(path)) <= set(CLASSES):
            raise FileExistsError(
                f"{path} exists and is not a Fashion-MNIST ImageFolder tree; "
                "remove it or choose another OUT")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    prog = os.path.basename(sys.argv[0]) or "make_fashion_mnist.py"
    missing = [name for pair in SPLITS.values() for name in pair
               if not os.path.isfile(os.path.join(args.source, name))]
    if missing:
        print(f"{prog}: error: Fashion-MNIST IDX files not found in "
              f"{args.source} (missing {', '.join(missing)}); install it "
              "with: apt-get install dataset-fashion-mnist", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    limits = {"train": args.limit_train, "test": args.limit_test}
    try:
        labels = load_labels(args.source, limits)
    except (OSError, ValueError, EOFError) as exc:
        print(f"{prog}: error: cannot read {args.source}: {exc}",
              file=sys.stderr)
        return 2
    expected = {"train": len(labels["train"]), "test": len(labels["test"]),
                "size": args.size, "format": args.format}
    if already_built(args.out, expected):
        print(f"{args.out}: already complete ({expected['train']} train + "
              f"{expected['test']} test {args.format} files, "
              f"{args.size}x{args.size}); nothing to do")
        return 0

    try:
        images = load_images(args.source, labels)
    except (OSError, ValueError, EOFError) as exc:
        print(f"{prog}: error: cannot read {args.source}: {exc}",
              file=sys.stderr)
        return 2
    marker = marker_path(args.out)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        os.makedirs(args.out, exist_ok=True)
        check_replaceable(args.out)
        if os.path.lexists(marker):
            os.remove(marker)
        total_bytes = build(args.out, images, labels, args.size, args.format)
        count = expected["train"] + expected["test"]
        with open(marker + ".tmp", "w") as f:
            json.dump(dict(expected, bytes=total_bytes), f)
            f.write("\n")
        os.replace(marker + ".tmp", marker)
    except OSError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {args.out} is incomplete, run again "
              "to rebuild it", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t0
    print(f"wrote {count} files ({expected['train']} train + "
          f"{expected['test']} test, {args.format} {args.size}x{args.size}) "
          f"to {args.out}: {total_bytes} bytes "
          f"({total_bytes / 2**20:.1f} MiB) in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
