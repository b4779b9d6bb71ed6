#!/usr/bin/env python3
"""Time to accuracy on Fashion-MNIST over slow S3: shuffle + static, PlanSampler + static,
ShadeSampler + shade (which announces its plan by default), several seeds.

Uploads a ``make_fashion_mnist.py`` tree (train/ and test/) to a moto process behind the latency proxy,
then per (mode, seed) mounts it fresh (``--ram-cache PCT%``) and runs ``train_fashion_mnist.py`` through
the mount; prints per-run epoch times and test accuracies, the wall time until the test accuracy first
reached ``--target``, and the final accuracy per mode (mean and spread over seeds).

    python scripts/bench_plan_tta.py --data /tmp/fm [--delay-ms 1] [--epochs 2] [--seeds 0,1] [--target 60]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from shadefs.testing.s3 import LatencyProxyProcess, MotoServer

HERE = os.path.dirname(os.path.abspath(__file__))
SHADEFS = [sys.executable, "-m", "shadefs"]
BUCKET = "bench-plan-tta"
MODES = {"shuffle+static": ("static", []), "plan+static": ("static", ["--plan"]),
         "shade+ShadeSampler(plan)": ("shade", ["--hook"]),
         "shade+ShadeSampler(no plan)": ("shade", ["--hook", "--no-plan"])}
DEFAULT_MODES = "shuffle+static,plan+static,shade+ShadeSampler(plan)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--pct", default="10%")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--target", type=float, default=60.0, help="test accuracy %% to reach")
    ap.add_argument("--json", metavar="OUT", help="save the results")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"some of {','.join(MODES)} (default {DEFAULT_MODES})")
    a = ap.parse_args(argv)
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true"),
                 ("NO_PROXY", "127.0.0.1,localhost")):
        os.environ.setdefault(k, v)
    work = tempfile.mkdtemp(prefix="plan-tta-")
    results = []
    with MotoServer(log_file=os.path.join(work, "moto.log")) as moto:
        s3 = moto.client()
        s3.create_bucket(Bucket=BUCKET)
        for d, _, fs in os.walk(a.data):
            for f in fs:
                full = os.path.join(d, f)
                rel = os.path.relpath(full, a.data)
                if rel.startswith(("train/", "test/")):
                    with open(full, "rb") as fh:
                        s3.put_object(Bucket=BUCKET, Key=f"ds/{rel}", Body=fh.read())
        with LatencyProxyProcess(moto.port, delay_ms=a.delay_ms, rate="1gbit") as proxy:
            for mode in a.modes.split(","):
                policy, flags = MODES[mode]
                for seed in [int(s) for s in a.seeds.split(",")]:
                    mnt = os.path.join(work, f"mnt-{len(results)}")
                    os.makedirs(mnt)
                    out = os.path.join(work, f"run-{len(results)}.json")
                    subprocess.run(SHADEFS + ["mount", f"s3://{BUCKET}/ds", mnt, "--ram-cache", a.pct,
                                              "--policy", policy, "--log-file", mnt + ".log",
                                              "--backend-opt", f"endpoint_url={proxy.endpoint}"],
                                   check=True, capture_output=True)
                    try:
                        print(f"... {mode} seed {seed}", file=sys.stderr, flush=True)
                        subprocess.run([sys.executable, os.path.join(HERE, "train_fashion_mnist.py"), "--data", mnt,
                                        "--epochs", str(a.epochs), "--workers", str(a.workers), "--seed", str(seed),
                                        "--json", out, *flags], check=True, capture_output=True)
                    finally:
                        subprocess.run(SHADEFS + ["umount", mnt], capture_output=True)
                    with open(out) as f:
                        train = json.load(f)
                    wall, tta = 0.0, None
                    for e in train["epochs"]:
                        wall += e["epoch_time_s"]
                        if tta is None and e["test_acc"] >= a.target:
                            tta = wall
                    results.append({"mode": mode, "seed": seed, "epochs": train["epochs"],
                                    "final_acc": train["final_test_acc"], "tta_s": tta, "train_s": wall})
    print(f"Fashion-MNIST subset from {a.data} over moto + proxy ({a.delay_ms:g} ms each way), RAM cache {a.pct}, "
          f"{a.epochs} epochs, {a.workers} workers; time to {a.target:g} % = training-epoch seconds until the "
          f"first epoch whose test accuracy reached it (evaluation excluded)")
    print("mode  seed  epoch times (s)  test acc per epoch (%)  time to target (s)")
    for r in results:
        times = ", ".join("%.1f" % e["epoch_time_s"] for e in r["epochs"])
        accs = ", ".join("%.2f" % e["test_acc"] for e in r["epochs"])
        tta = "%.1f" % r["tta_s"] if r["tta_s"] is not None else "not reached"
        print(f"{r['mode']}  {r['seed']}  {times}  {accs}  {tta}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("mode  final acc mean  (min..max)  mean training seconds")
    for mode in a.modes.split(","):
        rs = [r for r in results if r["mode"] == mode]
        accs = [r["final_acc"] for r in rs]
        ttas = [r["tta_s"] for r in rs if r["tta_s"] is not None]
        print(f"{mode}  {statistics.mean(accs):.2f}  ({min(accs):.2f}..{max(accs):.2f})  "
              f"{statistics.mean(r['train_s'] for r in rs):.1f}  time to target: "
              + (f"mean {statistics.mean(ttas):.1f} s over {len(ttas)}/{len(rs)} seeds" if ttas else "not reached"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
