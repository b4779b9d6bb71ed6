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


def test_imagefolder_over_s3_has_the_classes_of_the_source_empty_class_included(moto_server, mount, tmp_path):
    """Object stores have no directories, only keys: an empty S3 "folder" is a 0-byte key ending in "/"
    (a marker). Every marker is a directory of the mount, so ImageFolder numbers the classes as it does
    over the same tree on a local disk, for S3."""
    torchvision = require("torchvision")
    from torchvision.datasets import ImageFolder

    bucket = "shadefs-folders"
    s3 = moto_server.client()
    s3.create_bucket(Bucket=bucket)
    files = {"train/Bag/0.png": b"bag0", "train/Bag/1.png": b"bag1", "train/Dress/0.png": b"dress0"}
    markers = ["train/", "train/Bag/", "train/Boot/", "train/Coat/", "train/Coat/sub/", "empty/"]
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=data)
    for key in markers:  # Boot: an empty class; Coat: a class holding only an empty folder
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=b"")
    src = tmp_path / "src"  # the same tree on a local disk
    for key, data in files.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
    for key in markers:
        (src / key).mkdir(parents=True, exist_ok=True)
    m = mount(f"s3://{bucket}/{PREFIX}", "--ram-cache", "1MiB",
              "--backend-opt", f"endpoint_url={moto_server.endpoint}", "--backend-opt", "retries=1")
    assert sorted(os.listdir(m.path)) == ["empty", "train"]
    assert os.listdir(os.path.join(m.path, "empty")) == []
    assert sorted(os.listdir(os.path.join(m.path, "train"))) == ["Bag", "Boot", "Coat", "Dress"]
    assert os.listdir(os.path.join(m.path, "train", "Coat")) == ["sub"]
    assert os.path.isdir(os.path.join(m.path, "train", "Coat", "sub"))
    local = ImageFolder(str(src / "train"), loader=lambda p: open(p, "rb").read(), allow_empty=True,
                        is_valid_file=lambda p: p.endswith(".png"))
    over = ImageFolder(os.path.join(m.path, "train"), loader=lambda p: open(p, "rb").read(), allow_empty=True,
                       is_valid_file=lambda p: p.endswith(".png"))
    assert over.class_to_idx == local.class_to_idx == {"Bag": 0, "Boot": 1, "Coat": 2, "Dress": 3}
    assert [(os.path.relpath(p, os.path.join(m.path, "train")), y) for p, y in over.samples] == \
        [(os.path.relpath(p, str(src / "train")), y) for p, y in local.samples] == \
        [("Bag/0.png", 0), ("Bag/1.png", 0), ("Dress/0.png", 3)]
    assert [over[i][0] for i in range(3)] == [b"bag0", b"bag1", b"dress0"]
    assert m.umount() is None
    text = m.log()
    assert " ERROR " not in text and "Traceback" not in text and "skipped" not in text, text
