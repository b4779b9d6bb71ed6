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
