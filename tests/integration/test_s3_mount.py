"""A real FUSE mount of an S3 prefix (moto on loopback): every file reads back byte-exactly.

The CLI is run as users run it (``python -m shadefs.cli mount s3://bucket/prefix MNT --backend-opt
endpoint_url=...``), so the options travel as strings through the CLI, the fork and the daemon.
"""
import os

from conftest import require

boto3 = require("boto3")
require("s3fs", "moto.server")

BUCKET = "shadefs-mount"
PREFIX = "ds/train"
FILES = {
    "cat/0001.png": os.urandom(5000),
    "cat/0002.png": os.urandom(17),
    "dog/0001.png": os.urandom(120_000),
    "dog/sub/0002.png": b"",
}
SECRET = "shadefs-mount-secret-0a1b2c3d"  # moto accepts any; distinctive, to hunt for in the log


def test_mount_s3_prefix_reads_every_file_byte_exactly(moto_server, mount):
    s3 = moto_server.client()
    s3.create_bucket(Bucket=BUCKET)
    for path, data in FILES.items():
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path}", Body=data)
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/cat/", Body=b"")  # a directory marker
    s3.put_object(Bucket=BUCKET, Key="ds/other/x.png", Body=b"outside the prefix")
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": SECRET}
    m = mount(f"s3://{BUCKET}/{PREFIX}", "--ram-cache", "1MiB",
              "--backend-opt", f"endpoint_url={moto_server.endpoint}",
              "--backend-opt", "retries=2", "--backend-opt", "retry_base_s=0.01",
              "--log-level", "debug", env=env)
    mnt = m.path
    found = {}
    for root, dirs, files in os.walk(mnt):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, mnt)] = f.read()
    assert found == FILES
    assert sorted(os.listdir(mnt)) == ["cat", "dog"]
    assert os.stat(os.path.join(mnt, "dog/0001.png")).st_size == len(FILES["dog/0001.png"])
    assert not os.path.exists(os.path.join(mnt, "cat/missing.png"))
    for _ in range(2):  # a second epoch: served from the RAM tier, same bytes
        with open(os.path.join(mnt, "cat/0001.png"), "rb") as f:
            assert f.read() == FILES["cat/0001.png"]
    assert m.umount() is None
    text = m.log()
    assert SECRET not in text
    assert " ERROR " not in text and "Traceback" not in text, text
