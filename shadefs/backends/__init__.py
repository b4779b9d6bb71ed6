"""Backends: where the dataset lives. A registry keyed by URL scheme; one file per backend."""
from .base import Backend, BackendError, Entry, backend_for, open_backend, register  # noqa: F401
