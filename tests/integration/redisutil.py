"""Fixtures for the shared-tier tests: real redis-server processes (shadefs.testing.redis), torn down at
the end of each test."""
from __future__ import annotations

import pytest
from conftest import require

from shadefs.testing.redis import RedisCluster, RedisServer  # noqa: F401  (tests import them from here)


def require_redis() -> None:
    """Skip without redis-server, redis-cli and the redis/xxhash modules; FAIL under CI=true (``make
    test`` installs them: Debian redis-server + redis-tools, the ``shared`` extra)."""
    require("redis-server", "redis-cli", "redis", "xxhash")


@pytest.fixture
def redis_server(tmp_path):
    """A standalone redis-server on a free loopback port."""
    require_redis()
    s = RedisServer(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def redis_cluster(tmp_path):
    """A 3-master Redis Cluster (no replicas)."""
    require_redis()
    c = RedisCluster(tmp_path, masters=3)
    yield c
    c.stop()


@pytest.fixture
def redis_cluster_replica(tmp_path):
    """A 3-master Redis Cluster plus one replica of the first master (the failover test)."""
    require_redis()
    c = RedisCluster(tmp_path, masters=3, replicas=1)
    yield c
    c.stop()


def secret_file(directory, name: str = "group.secret", secret: bytes = b"0123456789abcdef" * 2) -> str:
    """A group secret for ``--shared-tier-secret``: ``secret`` in ``directory/name``, mode 0600."""
    import os

    path = os.path.join(str(directory), name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def shared_secret(tmp_path):
    """``("--shared-tier-secret", FILE)``: the flags that give a mount the test group's secret."""
    return ("--shared-tier-secret", secret_file(tmp_path))
