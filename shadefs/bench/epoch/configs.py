"""The epoch benchmark's runs (configs), their labels and mount policies, and its log line: what the
parent, the training child and the report share."""
from __future__ import annotations

import sys
import time

BUCKET = "shadefs-bench"
CONFIG_ORDER = ("direct", "direct-obstore", "local", "lru", "static", "shade", "plan", "shade-noplan",
                "lru-fsspec", "static-fsspec", "lru-base", "static-base")
DEFAULT_CONFIGS = ("direct",) + CONFIG_ORDER[2:8]
MOUNTED = CONFIG_ORDER[3:]
DIRECT = ("direct", "direct-obstore")  # the FUSE-less readers: s3fs or obstore in each DataLoader worker
LABELS = {"direct": "direct S3 (no shadefs)", "direct-obstore": "direct S3, obstore (no shadefs)", "local": "local disk (no shadefs)",
          "lru": "shadefs lru", "static": "shadefs static", "shade": "shadefs shade + hook",
          "plan": "shadefs static + PlanSampler", "shade-noplan": "shadefs shade + hook, no plan",
          "lru-fsspec": "shadefs lru, --backend fsspec", "static-fsspec": "shadefs static, --backend fsspec",
          "lru-base": "shadefs lru, --baseline", "static-base": "shadefs static, --baseline"}
# the mount's --policy per config; "shade" = ShadeSampler announcing its draws (its default),
# "shade-noplan" = ShadeSampler(announce_plan=False), "plan" = PlanSampler (uniform permutations, announced)
POLICY = {"lru": "lru", "static": "static", "shade": "shade", "plan": "static", "shade-noplan": "shade",
          "lru-fsspec": "lru", "static-fsspec": "static", "lru-base": "lru", "static-base": "static"}
# "-fsspec": this tree with s3fs as the client (--backend fsspec); "-base": the shadefs package of the
# --baseline revision (its default client), in the same run


def log(msg: str) -> None:
    print(f"[bench_epoch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
