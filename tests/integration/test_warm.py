"""``shadefs warm``: prefetch through the policy, not counted as opens; later opens are hits; a long
request holds a bounded number of files in flight and the daemon a bounded queue of requests."""
import os
import re
import time

import pytest

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true


def test_warm_admits_through_the_policy_and_counts_no_opens(small_tree, mount, cli):
    src, spec = small_tree
    # static, RAM 3000 B: in path order cat/01 (2000) fits, cat/03 (4000) does not, ..., dog/00 (1000) fits
    m = mount(src, "--ram-cache", "3000", "--no-kernel-cache")
    r = cli("warm", m.path, "--quiet")
    # the refused files are not read: 3000 B read, the two admitted files
    assert r.stdout.strip() == ("warm: 10 files: 2 admitted to RAM, 0 to disk, 0 already cached, "
                                "8 refused by the policy, 0 failed; 2.9 KiB read from the backend")
    s = m.stats()
    assert s["opens"] == 0 and s["tiers"]["ram"]["files"] == 2 and s["tiers"]["ram"]["used_bytes"] == 3000
    assert s["backend_bytes"] == 3000
    for rel in ("cat/01.bin", "dog/00.bin", "dog/02.bin"):
        with open(os.path.join(m.path, rel), "rb") as f:
            assert f.read() == spec[rel]
    s = m.stats()
    assert s["opens"] == 3 and s["hits"]["ram"] == 2 and s["misses"] == 1
    r = cli("warm", m.path, "cat/01.bin", "--quiet")
    assert "1 already cached" in r.stdout


def test_warm_rejects_paths_outside_the_mount(small_tree, mount, cli, tmp_path):
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    r = cli("warm", m.path, "../", check=False)
    assert r.returncode == 2 and "not inside" in r.stderr
    r = cli("warm", m.path, "cat/none.bin", check=False)
    assert r.returncode == 2 and "no such file" in r.stderr


def _frames(stderr: str):
    """The progress bar's successive states: (bytes done as drawn, files done) per redraw."""
    out = []
    for frame in re.split(r"[\r\n]", stderr):
        m = re.search(r"\| *([\d.]+ \w+)/[\d.]+ \w+ \[.*files=(\d+)/\d+", frame)
        if m:
            out.append((m[1], int(m[2])))
    return out


def test_warm_progress_bar_draws_each_state_once(tmp_path, mount, cli):
    from conftest import make_tree

    src = make_tree(tmp_path / "src", {f"d/{i:03d}.bin": bytes([i % 251]) * (100 + i) for i in range(300)})
    m = mount(src, "--ram-cache", "1MiB", "--no-kernel-cache")
    r = cli("warm", m.path)
    assert r.stdout.startswith("warm: 300 files: 300 admitted to RAM")
    frames = _frames(r.stderr)
    assert frames and frames[-1] == ("73.1 KiB", 300), r.stderr  # 74,850 bytes
    assert re.search(r"[\d.]+ (B|KiB|MiB)/s", r.stderr) and "kB" not in r.stderr, r.stderr  # binary units only
    assert [f for _, f in frames].count(300) == 1, r.stderr  # the last state is not drawn again at close
    files = [f for _, f in frames]
    assert files == sorted(set(files)), r.stderr  # no redraw shows a stale file count


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_long_warm_request_is_bounded_and_so_is_the_queue(small_tree, mount):
    import zmq

    from shadefs import registry
    from shadefs.control import protocol as P

    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB", "--no-kernel-cache")
    endpoint = registry.lookup(m.path).endpoint
    hwm = _vm_hwm(m.pid)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        rids = [P.new_request_id() for _ in range(6)]
        # one long request (100k opens' worth of one file), then five short ones sent while it runs
        sock.send_multipart(P.encode_warm_request(rids[0], ["cat/01.bin"] * 100_000))
        for rid in rids[1:]:
            sock.send_multipart(P.encode_warm_request(rid, ["dog/00.bin"]))
        replies = {}
        deadline = time.monotonic() + 240
        while len(replies) < len(rids) and time.monotonic() < deadline:
            if sock.poll(1000):
                reply = P.decode_reply(sock.recv_multipart())
                replies[reply.request_id] = reply
    finally:
        sock.close()
        ctx.term()
    assert set(replies) == set(rids)
    refused = [rid for rid in rids if isinstance(replies[rid], P.ErrorReply)]
    assert refused == rids[4:], [type(replies[r]).__name__ for r in rids]  # 4 queued or running at most
    assert "warm requests are queued already (at most 4)" in replies[rids[4]].message
    long = replies[rids[0]].result
    assert long == {"resident": 99_999, "ram": 1, "disk": 0, "rejected": 0, "failed": 0, "bytes": 2000}
    # the long request held a few files in flight, not 100k submitted reads (~190 MiB of futures)
    assert _vm_hwm(m.pid) - hwm < 64 * 2**20
