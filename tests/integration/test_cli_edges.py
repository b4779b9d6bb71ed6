"""Edges a new user meets at the command line: a missing bucket, a busy unmount, a live stats view."""
import os
import re

import pytest

from conftest import require
from shadefs.testing.mounts import shadefs


@pytest.mark.parametrize("args", [["--backend", "obstore"], ["--backend", "fsspec"],
                                  ["--backend", "obstore", "--backend-opt", "listing=obstore"]],
                         ids=["obstore", "fsspec", "obstore-listing"])
def test_a_missing_bucket_is_a_refusal_naming_the_bucket_and_the_endpoint(moto_server, tmp_path, fuse, args):
    require("obstore.store")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = shadefs("mount", "s3://shadefs-no-such-bucket/ds", mnt, "--backend-opt",
                f"endpoint_url={moto_server.endpoint}", "--log-file", tmp_path / "log", *args, check=False)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert r.stderr.splitlines()[-1] == (f"shadefs: error: bucket 'shadefs-no-such-bucket' does not exist at "
                                         f"{moto_server.endpoint}")
    assert not os.path.ismount(mnt)
