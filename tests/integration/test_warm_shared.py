"""``shadefs warm`` on a mount with a shared tier: a file no tier of this node admits is not read (the
policies are asked before the read), as on a mount without one."""
from __future__ import annotations

import pytest

from redisutil import require_redis, redis_server, shared_secret  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.usefixtures("fuse"), pytest.mark.timeout(60)]


def test_warm_with_a_shared_tier_reads_only_what_the_node_admits(small_tree, mount, cli, redis_server, shared_secret):
    require_redis()
    src, _ = small_tree
    # static, RAM 3000 B: cat/01 (2000) and dog/00 (1000) are admitted, the 8 others refused
    m = mount(src, "--ram-cache", "3000", "--no-kernel-cache", "--shared-tier", redis_server.url,
              "--shared-tier-size", "100KB", "--shared-tier-heartbeat", "0.1", "--shared-tier-partitions", "4",
              "--shared-tier-timeout", "0.5", *shared_secret)
    r = cli("warm", m.path, "--quiet")
    assert r.stdout.strip() == ("warm: 10 files: 2 admitted to RAM, 0 to disk, 0 already cached, "
                                "8 refused by the policy, 0 failed; 2.9 KiB read from the backend")
    s = m.stats()
    assert s["backend_bytes"] == 3000 and s["opens"] == 0
