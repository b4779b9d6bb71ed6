"""A ControlClient dropped without close() inside a reference cycle must not hang the garbage collector.

The collector clears a dying socket's weak references (the context's socket set) before it finalizes
anything; if it finalizes the context first, ``zmq_ctx_term`` waits forever for the socket it can no longer
see. Seen in the test suite: a failed test's traceback kept a ScoreReporter in a cycle, and a later
``gc.collect()`` (Namespace.scan) hung until the per-test timeout. Run in a child process so a hang is a
bounded failure here, not a hung suite.
"""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc, sys
    import zmq
    from shadefs.control.client import ControlClient

    # a peer that never reads: queued messages stay in the socket (LINGER decides how long at close)
    ctx = zmq.Context()
    peer = ctx.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    for i in range(20):
        c = ControlClient(f"tcp://127.0.0.1:{port}", timeout_s=0.2, linger_s=0.2, credentials=False)
        assert c.send_scores(["a/b.png"], [1.0])
        c.cycle = [c]  # only the cyclic collector can free it
        del c
    gc.collect()  # finalizes all 20 clients: each closes its socket (0.2 s linger), then its context
    peer.close(0)
    ctx.term()
    print("collected")
""")


def test_a_client_in_a_reference_cycle_is_collected_without_hanging():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "collected"
