"""What a restart detects about a changed source: size and mtime always; on S3 the ETag
too, which catches an overwrite that keeps the size and lands in the same second (S3 listings give
LastModified in whole seconds). A real moto S3 server process, the real fsspec backend, namespace, disk
tier, checkpointer and reload: everything the daemon runs at a restart, without the FUSE mount.
"""
import os
import threading

from conftest import require

require("boto3")
require("s3fs", "moto.server")

import pytest  # noqa: E402

from shadefs.backends import open_backend  # noqa: E402
from shadefs.backends.posix import PosixBackend, identity_tag  # noqa: E402
from shadefs.cache import persist  # noqa: E402
from shadefs.cache.core import TieredCache  # noqa: E402
from shadefs.cache.index import TierIndex  # noqa: E402
from shadefs.cache.tiers import DiskTier, MemoryTier  # noqa: E402
from shadefs.namespace import Namespace  # noqa: E402
from shadefs.policies import Importance, get_policy  # noqa: E402

BUCKET = "shadefs-etag"


def _cache(ns, backend, cache_dir, url):
    imp = Importance(ns.num_files)
    disk = DiskTier(str(cache_dir), url)
    index = TierIndex("disk", 1 << 20, get_policy("lru")(1 << 20, imp))
    ram = (TierIndex("ram", 0, get_policy("lru")(0, imp)), MemoryTier())
    return disk, index, imp, ram


def _fill_and_checkpoint(ns, backend, cache_dir, url):
    """A first mount: read every file into the disk tier, write the manifest, close."""
    disk, index, imp, ram = _cache(ns, backend, cache_dir, url)
    cache = TieredCache(ns, backend, ram, (index, disk), imp)
    for f in range(ns.num_files):
        h = cache.open(f)
        h.release()
    assert len(index) == ns.num_files
    digests = persist.PathDigests(ns.paths)
    persist.Checkpointer(disk.dir, ns, imp, index, digests, threading.Lock(), 0, entries=cache.entries).save()
    disk.close()


def _restart(ns, backend, cache_dir, url):
    """A second mount: reload the disk tier against the new listing; a cache over it."""
    disk, index, imp, ram = _cache(ns, backend, cache_dir, url)
    rep = persist.reload_disk_tier(disk, index, ns)
    return rep, TieredCache(ns, backend, ram, (index, disk), imp), disk


@pytest.mark.parametrize("client", ["obstore", "fsspec"])
def test_an_s3_overwrite_with_the_same_size_is_dropped_at_restart(moto_server, tmp_path, client):
    """An overwrite that keeps the size and lands in the listing's same LastModified second differs only by
    its ETag. Whether a real overwrite lands in the same second depends on how long the fill took (on a
    loaded machine it rarely does), so the second listing's mtime of the overwritten object is set to the
    first's: exactly what S3 lists for a same-second overwrite. The ETags are the real server's."""
    s3 = moto_server.client()
    s3.create_bucket(Bucket=BUCKET)
    url = f"s3://{BUCKET}/ds"
    backend = open_backend(url, client, endpoint_url=moto_server.endpoint, retries=0)
    v1, v2, keep = os.urandom(4096), os.urandom(4096), os.urandom(3000)
    s3.put_object(Bucket=BUCKET, Key="ds/c/keep.bin", Body=keep)
    s3.put_object(Bucket=BUCKET, Key="ds/c/x.bin", Body=v1)
    ns1 = Namespace.scan(backend)
    x = ns1.file_id("c/x.bin")
    assert ns1.etags[x] != 0 and ns1.etags[ns1.file_id("c/keep.bin")] != 0
    cache_dir = tmp_path / "cache"
    _fill_and_checkpoint(ns1, backend, cache_dir, url)  # the entry holds v1
    s3.put_object(Bucket=BUCKET, Key="ds/c/x.bin", Body=v2)
    ns2 = Namespace.scan(backend)
    assert ns2.sizes[x] == ns1.sizes[x] and ns2.etags[x] != ns1.etags[x]
    ns2.mtimes_ns[x] = ns1.mtimes_ns[x]  # the same LastModified second: size and mtime say "unchanged"
    rep, cache, disk = _restart(ns2, backend, cache_dir, url)
    assert (rep.loaded, rep.stale, rep.corrupt) == (1, 1, 0)  # keep.bin reloaded, x.bin dropped: the ETag
    assert rep.from_manifest == 2
    h = cache.open(x)
    assert (bytes(h.read(0, 4096)), h.outcome) == (v2, "miss")  # never v1
    h.release()
    h = cache.open(ns2.file_id("c/keep.bin"))
    assert (bytes(h.read(0, 3000)), h.outcome) == (keep, "disk")
    h.release()
    disk.close()
    backend.close()


def _posix_filled(tmp_path):
    """A posix source with one 2048-byte file, c/x.bin (v1), filled into a disk tier and checkpointed;
    returns (source dir, file path, v1, v2: other bytes of the same size, backend, namespace)."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    p = src / "c" / "x.bin"
    v1, v2 = os.urandom(2048), os.urandom(2048)
    p.write_bytes(v1)
    backend = PosixBackend(str(src))
    ns1 = Namespace.scan(backend)
    _fill_and_checkpoint(ns1, backend, tmp_path / "cache", str(src))
    return src, p, v1, v2, backend, ns1


def test_a_posix_change_with_the_same_size_and_mtime_is_not_detected(tmp_path):
    """The documented limit: posix gives no content tag (its tag is the file's inode), so a same-size
    rewrite in place that restores the mtime is served from the old entry after a restart (its checksum
    is of the old bytes, which are intact)."""
    src, p, v1, v2, backend, ns1 = _posix_filled(tmp_path)
    st = os.stat(p)
    assert int(ns1.etags[0]) == identity_tag(st.st_ino)  # the inode, not the content
    p.write_bytes(v2)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    ns2 = Namespace.scan(backend)
    rep, cache, disk = _restart(ns2, backend, tmp_path / "cache", str(src))
    assert (rep.loaded, rep.stale) == (1, 0)
    h = cache.open(0)
    assert (bytes(h.read(0, 2048)), h.outcome) == (v1, "disk")  # stale, as documented
    h.release()
    disk.close()


def test_a_posix_file_replaced_by_rename_with_the_same_size_and_mtime_is_dropped_at_restart(tmp_path):
    """A file replaced by another inode (written aside, renamed over it: how most tools update a file)
    differs in its identity tag even when size and mtime were kept: the old entry is stale."""
    src, p, v1, v2, backend, ns1 = _posix_filled(tmp_path)
    st = os.stat(p)
    tmp = src / "c" / ".x.bin.new"
    tmp.write_bytes(v2)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, p)
    ns2 = Namespace.scan(backend)
    assert (ns2.sizes[0], ns2.mtimes_ns[0]) == (ns1.sizes[0], ns1.mtimes_ns[0]) and ns2.etags[0] != ns1.etags[0]
    rep, cache, disk = _restart(ns2, backend, tmp_path / "cache", str(src))
    assert (rep.loaded, rep.stale) == (0, 1)
    h = cache.open(0)
    assert (bytes(h.read(0, 2048)), h.outcome) == (v2, "miss")  # never v1
    h.release()
    disk.close()
