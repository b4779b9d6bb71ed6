"""The baseline side of a side-by-side benchmark (shadefs.testing.baseline): a revision's package extracted
with git, and the working tree's compiled extensions copied beside their C source only where that source is
the same at the revision."""
import os
import subprocess

from shadefs.testing import baseline


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_a_compiled_extension_goes_to_the_baseline_only_where_its_source_is_the_same(tmp_path):
    repo = tmp_path / "repo"
    (repo / "shadefs" / "fuse").mkdir(parents=True)
    (repo / "shadefs" / "cache").mkdir(parents=True)
    (repo / "shadefs" / "__init__.py").write_text("")
    (repo / "shadefs" / "fuse" / "_loop.c").write_text("int loop;\n")
    (repo / "shadefs" / "cache" / "_read.c").write_text("int read_v1;\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "rev")
    # the working tree after that revision: one source changed, one new, each built
    (repo / "shadefs" / "cache" / "_read.c").write_text("int read_v2;\n")
    (repo / "shadefs" / "cache" / "_new.c").write_text("int new;\n")
    so = "cpython-311-x86_64-linux-gnu.so"
    for rel in ("fuse/_loop", "cache/_read", "cache/_new"):
        (repo / "shadefs" / f"{rel}.{so}").write_bytes(rel.encode())
    tmp, rev = baseline.extract(str(repo), "HEAD")
    try:
        found = sorted(os.path.relpath(os.path.join(d, f), tmp) for d, _, fs in os.walk(tmp) for f in fs)
        assert found == ["shadefs/__init__.py", "shadefs/cache/_read.c", "shadefs/fuse/_loop.c",
                         f"shadefs/fuse/_loop.{so}"]
        with open(os.path.join(tmp, "shadefs", "fuse", f"_loop.{so}"), "rb") as f:
            assert f.read() == b"fuse/_loop"
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
        assert len(rev) >= 7 and head.startswith(rev)   # git's short hash of that revision (7 digits or more)
    finally:
        import shutil

        shutil.rmtree(tmp)
