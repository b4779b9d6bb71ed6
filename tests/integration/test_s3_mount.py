"""A real FUSE mount of an S3 prefix (moto on loopback): every file reads back byte-exactly.

The CLI is run as users run it (``python -m shadefs.cli mount s3://bucket/prefix MNT --backend-opt
endpoint_url=...``), so the options travel as strings through the CLI, the fork and the daemon.
"""
import os
import shutil
import subprocess
import sys

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
server_mod = pytest.importorskip("moto.server")

BUCKET = "shadefs-mount"
PREFIX = "ds/train"
FILES = {
    "cat/0001.png": os.urandom(5000),
    "cat/0002.png": os.urandom(17),
    "dog/0001.png": os.urandom(120_000),
    "dog/sub/0002.png": b"",
}
SECRET = "shadefs-mount-secret-0a1b2c3d"  # moto accepts any; distinctive, to hunt for in the log
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
         "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
         "AWS_CONFIG_FILE": "/nonexistent/shadefs-test-aws-config",
         "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/shadefs-test-aws-credentials",
         "NO_PROXY": "127.0.0.1,localhost"}


def _fuse_usable() -> bool:
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return False
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _fuse_usable(), reason="needs /dev/fuse and fusermount")


def _cli(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "shadefs.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def s3_endpoint():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in CREDS.items():
            mp.setenv(name, value)
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for path, data in FILES.items():
            s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path}", Body=data)
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/cat/", Body=b"")  # a directory marker
        s3.put_object(Bucket=BUCKET, Key="ds/other/x.png", Body=b"outside the prefix")
        yield endpoint
        server.stop()


def test_mount_s3_prefix_reads_every_file_byte_exactly(s3_endpoint, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    env = {**os.environ, **CREDS}
    mount = _cli("mount", f"s3://{BUCKET}/{PREFIX}", str(mnt), "--ram-cache", "1MiB",
                 "--log-file", str(log), "--backend-opt", f"endpoint_url={s3_endpoint}",
                 "--backend-opt", "retries=2", "--backend-opt", "retry_base_s=0.01",
                 "--log-level", "debug", env=env)
    assert mount.returncode == 0, mount.stderr + (log.read_text() if log.exists() else "")
    try:
        found = {}
        for root, dirs, files in os.walk(mnt):
            for name in files:
                full = os.path.join(root, name)
                with open(full, "rb") as f:
                    found[os.path.relpath(full, mnt)] = f.read()
        assert found == FILES
        assert sorted(os.listdir(mnt)) == ["cat", "dog"]
        assert os.stat(mnt / "dog/0001.png").st_size == len(FILES["dog/0001.png"])
        assert not (mnt / "cat/missing.png").exists()
        for _ in range(2):  # a second epoch: served from the RAM tier, same bytes
            assert (mnt / "cat/0001.png").read_bytes() == FILES["cat/0001.png"]
    finally:
        umount = _cli("umount", str(mnt), env=env)
        assert umount.returncode == 0, umount.stderr
    text = log.read_text()
    assert SECRET not in text
    assert " ERROR " not in text and "Traceback" not in text, text
