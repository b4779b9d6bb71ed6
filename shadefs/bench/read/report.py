"""The read benchmark's report: its tables, the text on what limits each path (computed from the
figures), the machine it ran on, the section of docs/results/read.md and the plot."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

from shadefs.bench.read.measure import CASES, LABELS, SLOW_LOOPS
from shadefs.bench.read.rig import PER_DIR, READ_CHUNK
from shadefs.testing import docsection
from shadefs.testing.docsection import Table

DOC_START, DOC_END = docsection.markers("bench_read")
TARGET = 0.3           # hit path with 8 readers >= 0.3 x the direct page-cache rate


def targets_table(results: Dict[str, dict], slow: Optional[dict], hung: Optional[dict], readers: List[int]) -> Table:
    """The read-path targets for the default front end (kernel, default flags), all from this run."""
    top = max(readers)
    rows = []

    def row(what, value, target, ok):
        rows.append([what, value, target, "yes" if ok else "no"])

    for size_label, res in results.items():
        small = "B" in size_label and "KB" not in size_label
        if "ram-kernel" in res:
            q = res["ram-kernel"][top]["files_s"] / res["direct"][top]["files_s"]
            want = 0.2 if small else 0.4
            row(f"{size_label}: RAM hit / direct, {top} readers", _ratio(q), f">= {want}", q >= want)
        if "nvme-kernel" in res and "ram-kernel" in res:
            q = res["nvme-kernel"][top]["files_s"] / res["ram-kernel"][top]["files_s"]
            row(f"{size_label}: NVMe hit (passthrough) / RAM hit, {top} readers", _ratio(q), ">= 0.8", q >= 0.8)
        inproc = res.get("_inproc", {})
        for key, what, limit in (("ram-kernel", "daemon CPU per RAM hit", 20), ("nvme-kernel", "daemon CPU per NVMe hit", 20),
                                 ("miss-kernel-ram", "daemon CPU per miss (posix backend read included)", None)):
            if key in res:
                for r in sorted({min(readers), top}):
                    cpu = res[key][r].get("cpu_us")
                    if cpu is None:
                        continue
                    if limit is not None:
                        row(f"{size_label}: {what}, {r} rd", f"{cpu:.0f} us", f"<= {limit} us", cpu <= limit)
                    elif "backend_read_us" in inproc:
                        b = inproc["backend_read_us"]
                        row(f"{size_label}: daemon CPU per miss excluding the backend read ({cpu:.0f} - {b:.0f} us "
                            f"in process), {r} rd", f"{cpu - b:.0f} us", "<= 50 us", cpu - b <= 50)
        if "verify_us" in inproc:
            extra = ""
            if "nvme-kernel-every" in res and "nvme-kernel" in res:
                a, b = res["nvme-kernel-every"][top].get("cpu_us"), res["nvme-kernel"][top].get("cpu_us")
                if a is not None and b is not None:
                    extra = f"; daemon CPU every-open - first-hit, {top} rd: {a - b:+.0f} us"
            rows.append([f"{size_label}: entry checksum per NVMe hit (in process: open, pread, xxh3, close)",
                         f"{inproc['verify_us']:.1f} us{extra}", "measured", "-"])
    for one in (slow or {}).values():
        if "kernel" in one:
            p99 = one["kernel"]["hit_ms_p99"]
            row(f"slow backend +{one['delay_ms']:g} ms: hit p99 with misses in flight", f"{p99:.2f} ms", "<= 1 ms",
                p99 <= 1.0)
    if hung and "before" in hung and "during" in hung:
        b, d = hung["before"], hung["during"]
        row(f"{hung['hung']} hung backend reads: hit p99 during / before", f"{d['hit_ms_p99']:.2f} / "
            f"{b['hit_ms_p99']:.2f} ms", "normal", d["hit_ms_p99"] <= max(1.0, 2 * b["hit_ms_p99"]))
        row(f"{hung['hung']} hung backend reads: miss p99 during / before", f"{d['miss_ms_p99']:.2f} / "
            f"{b['miss_ms_p99']:.2f} ms", "normal", d["miss_ms_p99"] <= max(2.0, 2 * b["miss_ms_p99"]))
    return Table("Targets, kernel front end with default flags (same run)", ["target", "measured",
                 "target", "meets"], rows)


def hung_table(h: dict) -> Table:
    rows = [[tag, _f(h[tag]["hit_files_s"]), f"{h[tag]['hit_ms_p50']:.2f}", f"{h[tag]['hit_ms_p99']:.2f}",
             _f(h[tag]["miss_files_s"]), f"{h[tag]['miss_ms_p50']:.2f}", f"{h[tag]['miss_ms_p99']:.2f}"]
            for tag in ("before", "during") if tag in h]
    return Table(f"Hung backend, kernel front end: {h['hung']} backend reads that never return (opens of the "
                 f"source block in its FUSE daemon), {h['readers']} readers of ~110 KB hits / misses on other "
                 f"files (load average {_load_str(h['_load'])})",
                 ["", "hits files/s", "hit p50 ms", "hit p99 ms", "misses files/s", "miss p50 ms", "miss p99 ms"],
                 rows, note=f"While hung: {h['still_blocked']} of {h['hung']} readers still blocked (process states "
                            f"{h['hung_states']}: S = interruptible); one killed with SIGKILL exited after "
                            f"{h['kill_exit_ms']:.1f} ms (shadefs answered the kernel's INTERRUPT).")


def _load_str(loads) -> str:
    return " -> ".join("/".join(f"{x:.2f}" for x in l) for l in loads)


def _ratio(q: float) -> str:
    """Two decimals, rounded down, so that a ratio shown as 0.30 never misses a 0.3 target."""
    return f"{int(q * 100) / 100:.2f}"


def _f(x: float) -> str:
    return f"{x:,.0f}"


def size_table(size_label: str, res: dict, readers: List[int]) -> Table:
    top = max(readers)
    direct_top = res["direct"][top]["files_s"]
    headers = ["case"] + [f"files/s, {r} rd" for r in readers] + [f"MB/s, {r} rd" for r in readers] + \
              [f"x direct, {top} rd"]
    rows = []
    for key in ["direct"] + [c[0] for c in CASES]:
        if key not in res:
            continue
        row = [LABELS[key]] + [_f(res[key][r]["files_s"]) for r in readers] + \
              [f"{res[key][r]['mb_s']:,.1f}" for r in readers] + [f"{res[key][top]['files_s'] / direct_top:.2f}"]
        rows.append(row)
    return Table(f"{size_label} files: median of the timed passes (load average 1/5/15 min: "
                 f"{_load_str(res['_load'])})", headers, rows)


def cpu_table(results: Dict[str, dict], readers: List[int]) -> Optional[Table]:
    rows = []
    for size_label, res in results.items():
        for key in [c[0] for c in CASES]:
            if key in res and all("cpu_us" in res[key][r] for r in readers):
                rows.append([size_label, LABELS[key]] + [f"{res[key][r]['cpu_us']:.0f}" for r in readers])
    if not rows:
        return None
    return Table("Daemon CPU time per open, us (user + system of the daemon process, median of the timed passes; "
                 f"clock tick {1e3 / os.sysconf('SC_CLK_TCK'):g} ms, less sensitive to other load than files/s)",
                 ["files", "case"] + [f"{r} rd" for r in readers], rows)


def ratio_table(title: str, results: Dict[str, dict], pairs: List[Tuple[str, str, str]], readers: List[int],
                pct: bool = False) -> Table:
    """Rows: (size, label) for each pair (a, b, label): a / b per reader count (or (a / b - 1) as a %)."""
    headers = ["files", "comparison"] + [f"{r} rd" for r in readers]
    rows = []
    for size_label, res in results.items():
        for a, b, label in pairs:
            if a not in res or b not in res:
                continue
            cells = []
            for r in readers:
                q = res[a][r]["files_s"] / res[b][r]["files_s"]
                cells.append(f"{(q - 1) * 100:+.0f} %" if pct else f"{q:.2f}x")
            rows.append([size_label, label] + cells)
    return Table(title, headers, rows)


def target_table(results: Dict[str, dict], readers: List[int]) -> Tuple[Table, List[str]]:
    top = max(readers)
    rows, lines = [], []
    for size_label, res in results.items():
        d = res["direct"][top]["files_s"]
        for key, label, tier, *_ in CASES:
            if tier.startswith("miss") or key not in res:
                continue
            x = res[key][top]["files_s"]
            ok = x >= TARGET * d
            rows.append([size_label, label, _f(x), _f(d), _ratio(x / d), "yes" if ok else "no"])
    t = Table(f"Target: hit path with {top} readers >= {TARGET} x direct (same run)",
              ["files", "case", f"files/s, {top} rd", f"direct, {top} rd", "ratio", "meets"], rows)
    return t, lines


def requests_table(results: Dict[str, dict], n: int) -> Optional[Table]:
    cols = ["LOOKUP", "GETATTR", "OPEN", "READ", "FLUSH", "RELEASE"]
    rows = []
    for size_label, res in results.items():
        for key, counts in res.get("_requests", {}).items():
            other = sum(v for k, v in counts.items() if k not in cols)
            rows.append([size_label, LABELS[key]] + [f"{counts.get(c, 0):.2f}" for c in cols] + [f"{other:.2f}"])
    if not rows:
        return None
    return Table(f"FUSE requests received by the daemon per open (strace of its reads of /dev/fuse, 1 reader, "
                 f"{n} files after the timed passes; the loop mode does not change them)",
                 ["files", "case"] + cols + ["other"], rows)


def slow_table(slow: dict) -> Table:
    rows = []
    for loop in SLOW_LOOPS:
        if loop not in slow:
            continue
        o = slow[loop]
        rows.append([loop, _f(o["hits_only_files_s"]), _f(o["mixed_files_s"]), _f(o["mixed_hits_s"]),
                     f"{o['hit_ms_p50']:.2f}", f"{o['hit_ms_p90']:.2f}", f"{o['hit_ms_p99']:.2f}",
                     f"{o['miss_ms_p50']:.2f}"])
    return Table(f"Slow backend: {slow['files']} files of ~110 KB, half in RAM, every READ of the source "
                 f"+{slow['delay_ms']:g} ms, {slow['readers']} readers (load average {_load_str(slow['_load'])})",
                 ["FUSE loop", "hits alone, files/s", "mixed, files/s", "hits/s in mixed", "hit p50 ms",
                  "hit p90 ms", "hit p99 ms", "miss p50 ms"], rows,
                 note=f"The slow source read directly by the same readers (the miss half): "
                      f"{_f(slow['backend_direct'])} files/s"
                      + (f"; the passthrough served {slow['slowfs']['reads']:,} READs for "
                         f"{slow['slowfs']['opens']:,} opens ({slow['slowfs']['reads'] / max(1, slow['slowfs']['opens']):.2f} "
                         f"per open)" if slow.get('slowfs') else "") + ".")


def per_open_us(res: dict, key: str, readers: int = 1) -> float:
    return 1e6 / res[key][readers]["files_s"]


def kernel_limits_text(results: Dict[str, dict], readers: List[int]) -> str:
    """The remaining gap of the kernel front end to a direct page-cache read, and what it is made of."""
    one = 1 if 1 in readers else min(readers)
    bits = []
    for size_label, res in results.items():
        if "ram-kernel" not in res:
            continue
        d1, r1 = per_open_us(res, "direct", one), per_open_us(res, "ram-kernel", one)
        cpu = res["ram-kernel"][one].get("cpu_us")
        b = (f"{size_label} files, {one} reader: direct {d1:.0f} us per file, kernel front end RAM hit {r1:.0f} us "
             f"(+{r1 - d1:.0f} us" + (f", of which {cpu:.0f} us daemon CPU" if cpu is not None else "") + ")")
        req = res.get("_requests", {}).get("ram-kernel")
        if req:
            b += (f"; requests per open: OPEN {req.get('OPEN', 0):.2f}, RELEASE {req.get('RELEASE', 0):.2f}, "
                  f"READ {req.get('READ', 0):.2f}, LOOKUP {req.get('LOOKUP', 0):.2f}, FLUSH {req.get('FLUSH', 0):.2f}")
        if "nvme-kernel" in res:
            n1 = per_open_us(res, "nvme-kernel", one)
            ncpu = res["nvme-kernel"][one].get("cpu_us")
            b += (f"; NVMe hit by passthrough {n1:.0f} us" + (f" ({ncpu:.0f} us daemon CPU)" if ncpu is not None else ""))
        bits.append(b)
    return (
        "Kernel front end (the default): a kernel-cached hit is two round trips, OPEN and RELEASE (LOOKUP "
        "once per path, then cached for an hour; READ only when the kernel does not hold the file's pages; "
        "FLUSH and ACCESS are answered ENOSYS once and never sent again). Each round trip is: the reader "
        "blocks, the kernel queues the request and wakes a reader thread of the daemon (2 by default, each on "
        "its own clone of /dev/fuse), which returns from read(2), takes the GIL, decodes the 40-byte header, "
        "asks the cache (RAM or NVMe hit: no other thread involved) and writes the reply with one writev(2); "
        "no data is copied on a kernel-cached hit. The daemon's CPU per open (the CPU table) is therefore two "
        "blocking read(2)/writev(2) pairs with their wake-ups (kernel time; a syscall costs ~2 us on this VM "
        "and a wake-up several) plus ~10 us of Python in the OPEN and RELEASE handlers (measured in process, "
        "replies written to /dev/null) and the GIL handoffs between reader threads: 4 reader threads cost "
        "more CPU per open than 2 (the `--fuse-readers 4` row). An NVMe hit by passthrough is also OPEN + "
        "RELEASE, and the kernel reads the entry file itself (no READ, no copy through the daemon); with "
        "`--verify-entries first-hit` (opt-in) the daemon reads the entry only at the first hit of each entry, "
        "and once a passthrough backing id is kept for it no longer opens it either (`TieredCache.open_kept`: "
        "\"The NVMe first-hit cost split\" below); with `every-open` (the default) it opens, reads and hashes "
        "it whole at every open (the checksum row: in-process cost per file). A miss is OPEN handed to a worker thread "
        "(a queue and a wake-up), the backend read, admission into the RAM tier (victims evicted), the reply "
        "from the worker, one READ per 1 MiB answered inline from the tier's bytes (one copy into the kernel) "
        "and RELEASE. What remains to native is the two round trips per open and, at 8 readers on 2 cores, "
        "the CPU they take from the readers. Measured: " + "; ".join(bits) + ".")


def limits_text(results: Dict[str, dict], slow: Optional[dict], readers: List[int]) -> str:
    top = max(readers)
    one = 1 if 1 in readers else min(readers)
    parts = []
    parts.append(kernel_limits_text(results, readers))
    parts.append(
        "With the libfuse front end, every open through the mount costs FUSE round trips, each a switch into the daemon and back through "
        "the kernel, libfuse, ctypes and a Python callback: LOOKUP (once per path, then cached for "
        "`entry_timeout` = 3600 s), OPEN (the cache lookup; it decides `keep_cache`), READ (one per 128 KiB; "
        "skipped on a hit when `keep_cache` lets the kernel keep the file's pages from an earlier open) and "
        "RELEASE. GETATTR is cached (`attr_timeout` = 3600 s), FLUSH is not registered (the kernel stops "
        "sending it after the first ENOSYS) and the reader's EOF read never leaves the kernel. So a "
        "kernel-cached hit (RAM or NVMe) is two round trips, OPEN and RELEASE; a hit without kernel cache and "
        "a miss add one READ per 128 KiB (the requests table above shows the measured counts; ~110 KB files "
        "+-30 % need 1.2 READs on average). The direct read is two system calls and no switch. shadefs' own "
        "Python work in OPEN + RELEASE of a RAM hit is ~3 us (measured in-process, without FUSE); the rest of "
        "each per-file time below is the round trips.")
    for size_label, res in results.items():
        if not all(k in res for k in ("direct", "ram-multi", "ram-single")):
            continue
        s = (f"{size_label} files, {one} reader: direct {per_open_us(res, 'direct', one):.0f} us per file; "
             f"RAM hit {per_open_us(res, 'ram-single', one):.0f} us (single loop) and "
             f"{per_open_us(res, 'ram-multi', one):.0f} us (multi loop)")
        if "ram-single-nokc" in res:
            s += (f"; without kernel cache {per_open_us(res, 'ram-single-nokc', one):.0f} us (single) / "
                  f"{per_open_us(res, 'ram-multi-nokc', one):.0f} us (multi), i.e. the READ round trip and its "
                  f"copy add {per_open_us(res, 'ram-single-nokc', one) - per_open_us(res, 'ram-single', one):.0f} us "
                  f"/ {per_open_us(res, 'ram-multi-nokc', one) - per_open_us(res, 'ram-multi', one):.0f} us")
        if "miss-single" in res:
            s += (f"; a miss {per_open_us(res, 'miss-single', one):.0f} us (single) / "
                  f"{per_open_us(res, 'miss-multi', one):.0f} us (multi)")
        if "nvme-single" in res:
            s += (f"; an NVMe hit {per_open_us(res, 'nvme-single', one):.0f} us (single) / "
                  f"{per_open_us(res, 'nvme-multi', one):.0f} us (multi)")
        parts.append(s + ".")
    cpu_bits = []
    for size_label, res in results.items():
        if all(k in res and "cpu_us" in res[k].get(one, {}) for k in ("ram-multi", "ram-single")):
            cpu_bits.append(f"{res['ram-multi'][one]['cpu_us']:.0f} vs {res['ram-single'][one]['cpu_us']:.0f} us "
                            f"for {size_label} RAM hits")
    parts.append(
        "The multithreaded loop (libfuse's `fuse_loop_mt`: a pool of threads, each blocked in read() on "
        "/dev/fuse, growing while requests wait) hands every request to a thread that was asleep, and its "
        "Python callback must then take the GIL from whichever thread had it; with the single-threaded loop "
        "one thread that holds the interpreter finds the next request already queued (the kernel sends "
        "RELEASE asynchronously, so the reader's next OPEN is often waiting). The daemon's CPU time per open "
        "shows the difference" + (f" ({one} reader: " + "; ".join(cpu_bits) + ", multi vs single)" if cpu_bits
                                  else "") + ". With mfusepy on CPython 3.11 each callback on a libfuse thread "
        "also creates and destroys a Python thread state (ctypes' `PyGILState_Ensure`/`Release`; one mmap and "
        "one munmap of a frame stack per callback); keeping one per thread removed those calls in an experiment "
        "but did not lower the CPU per open measurably, so the wake-ups, not the thread states, are the cost. "
        "The single-threaded loop is faster per request but serialises everything, so one slow backend read "
        "stalls every reader (the slow-backend table).")
    # target statement
    for size_label, res in results.items():
        d = res["direct"][top]["files_s"]
        verdicts = []
        for key, label, tier, *_ in CASES:
            if tier.startswith("miss") or key not in res:
                continue
            x = res[key][top]["files_s"]
            verdicts.append(f"{label} {_ratio(x / d)} ({'meets' if x >= TARGET * d else 'misses'})")
        parts.append(f"Target (hit path, {top} readers >= {TARGET} x direct = {_f(TARGET * d)} files/s for "
                     f"{size_label} files, direct {_f(d)} files/s): " + "; ".join(verdicts) + ".")
    for slow in (slow or {}).values():
        if not ("multi" in slow and "single" in slow and "kernel" in slow):
            continue
        m, s, k = slow["multi"], slow["single"], slow["kernel"]
        parts.append(
            f"Slow backend (+{slow['delay_ms']:g} ms per source READ, half of the opens hits), kernel front "
            f"end: a hit's p50 {k['hit_ms_p50']:.2f} ms, p99 {k['hit_ms_p99']:.2f} ms (target p99 <= 1 ms: "
            f"{'meets' if k['hit_ms_p99'] <= 1.0 else 'misses'}); mixed rate {_f(k['mixed_files_s'])} files/s.")
        parts.append(
            f"Slow backend (+{slow['delay_ms']:g} ms per source READ, half of the opens hits): a hit's p50 "
            f"latency is {m['hit_ms_p50']:.2f} ms with the multithreaded loop and {s['hit_ms_p50']:.2f} ms with "
            f"the single-threaded loop, where it waits behind the miss being served; the mixed rate is "
            f"{_f(m['mixed_files_s'])} vs {_f(s['mixed_files_s'])} files/s.")
    return "\n\n".join(parts)


def machine_info(work: str) -> dict:
    info = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu"] = cpu
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    r = subprocess.run([sys.executable, "-c", "from shadefs.daemon import select_libfuse; select_libfuse(); "
                        "import mfusepy, importlib.metadata as m; "
                        "print(mfusepy.fuse_version_major, mfusepy.fuse_version_minor, mfusepy._libfuse_path, "
                        "m.version('mfusepy'))"], capture_output=True, text=True, timeout=60)
    parts = r.stdout.split()
    if len(parts) == 4:
        info["libfuse"] = f"{parts[0]}.{parts[1]}"
        info["libfuse_path"] = parts[2]
        info["mfusepy"] = parts[3]
    best, fs = "", "?"
    real = os.path.realpath(work)
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            mp_ = p[1].encode().decode("unicode_escape")
            if (real == mp_ or real.startswith(mp_.rstrip("/") + "/")) and len(mp_) >= len(best):
                best, fs = mp_, f"{p[2]} ({p[0]})"
    info["workdir_fs"] = fs
    return info


def build_report(args, info: dict, results: Dict[str, dict], slow: Optional[dict], command: str,
                 started: str, elapsed: float) -> Tuple[List[Table], str]:
    readers = args.readers
    tables = [size_table(label, res, readers) for label, res in results.items()]
    ct = cpu_table(results, readers)
    if ct is not None:
        tables.append(ct)
    tables.append(ratio_table("FUSE loop: single / multi (files/s ratio, > 1: single is faster)", results,
                              [("ram-single", "ram-multi", "RAM hit"),
                               ("ram-single-nokc", "ram-multi-nokc", "RAM hit, no kernel cache"),
                               ("nvme-single", "nvme-multi", "NVMe hit"),
                               ("miss-single", "miss-multi", "miss")], readers))
    tables.append(ratio_table("Kernel cache: on / off for RAM hits (files/s ratio)", results,
                              [("ram-multi", "ram-multi-nokc", "multi loop"),
                               ("ram-single", "ram-single-nokc", "single loop")], readers))
    tables.append(ratio_table("--trace FILE on RAM hits: change in files/s (negative: the trace costs)", results,
                              [("ram-multi-trace", "ram-multi", "multi loop"),
                               ("ram-single-trace", "ram-single", "single loop")], readers, pct=True))
    tables.append(ratio_table("Front end: kernel / libfuse (files/s ratio, > 1: the kernel front end is faster)",
                              results, [("ram-kernel", "ram-multi", "RAM hit, vs libfuse multi"),
                                        ("ram-kernel", "ram-single", "RAM hit, vs libfuse single"),
                                        ("nvme-kernel", "nvme-kernel-nopt", "NVMe hit, passthrough vs not"),
                                        ("nvme-kernel", "ram-kernel", "NVMe hit (passthrough) vs RAM hit"),
                                        ("miss-kernel", "miss-multi", "miss, vs libfuse multi")], readers))
    tables.append(targets_table(results, slow, getattr(args, "hung_result", None), readers))
    t, _ = target_table(results, readers)
    tables.append(t)
    rt = requests_table(results, args.count_requests)
    if rt is not None:
        tables.append(rt)
    for one in (slow or {}).values():
        tables.append(slow_table(one))
    if getattr(args, "hung_result", None):
        tables.append(hung_table(args.hung_result))

    md = [DOC_START, "## Read path", "",
          f"Generated by `python -m shadefs.bench read` on {started} in {elapsed / 60:.1f} min; everything between the "
          f"`bench_read` markers is rewritten by `--write-doc`, so rerun it rather than editing by hand.", "",
          f"- **Machine**: {info['nproc']} CPUs ({info.get('cpu') or '?'}), {info.get('mem_gib', '?')} GiB RAM, "
          f"Linux `{info['kernel']}`, Python {info['python']}, libfuse {info.get('libfuse', '?')} as loaded by "
          f"mfusepy {info.get('mfusepy', '?')} (`{info.get('libfuse_path', '?')}`); datasets, NVMe tier "
          f"directory and mountpoints on {info['workdir_fs']}.",
          f"- **Command**: `{command}`",
          f"- **Load average (1/5/15 min)**: {_load_str([args.load_start])} at start, {_load_str([args.load_end])} "
          f"at the end; per experiment in each table's title (start -> end)."
          + (" The machine was shared with other work while this ran, so absolute numbers are noisy: compare "
             "rows of one table (measured interleaved) rather than runs, and prefer the daemon CPU per open, "
             "which load disturbs less." if args.noisy_note else ""),
          *(["- **Quick run (`--quick`)**: a smoke test, not reference numbers."] if args.quick else []),
          f"- **Method**: {args.files} files per size (~{args.small_size} B and ~{args.large_size // 1000} KB, "
          f"+-30 %, {PER_DIR} per directory); readers are processes reading disjoint contiguous shards with "
          f"`os.open`/`os.read({READ_CHUNK // 1024} KiB)` until EOF/`os.close`; all cases of one file size are "
          f"mounted at once, warmed with one pass, then timed round-robin (every case once per round, "
          f"{args.repeat} rounds per reader count, median reported; a pass shorter than {args.min_pass_s:g} s "
          f"reads the files several times), so load that comes and goes touches every row alike. Each mount's counters must show every timed open "
          f"as the outcome named (`shadefs stats --json`), every pass must return the exact byte count, and "
          f"{args.verify + 2} files per mount are compared byte for byte with the source. `RAM hit`: "
          f"`--ram-cache 100%`; `NVMe hit`: `--ram-cache 0 --disk-cache DIR --disk-cache-size` twice the files' bytes and 64 MiB (the "
          f"entries sit in the page cache: the daemon's path, not the device, is measured); `miss`: "
          f"`--ram-cache 0 --policy static --no-kernel-cache` (source page cache warm; every open reads it through the daemon); `kernel`: `--fuse-impl kernel` (the "
          f"default front end; NVMe hits by passthrough unless `--no-passthrough`); `libfuse multi`/`single`: `--fuse-impl libfuse "
          f"--fuse-loop multi|single`. Slow backend: every front end mounted over the same latency-injecting "
          f"source, measured in turn; hung backend: the source is a FUSE view whose opens of `hang/` files "
          f"block until released (`{args.hung}` readers blocked on them), hits and other misses measured "
          f"before and while they hang.",
          ""]
    for t in tables:
        md += [t.markdown(), ""]
    md += ["### What limits it", "", limits_text(results, slow, readers), ""]
    if args.plot:
        rel = os.path.relpath(os.path.abspath(args.plot), os.path.dirname(os.path.abspath(args.doc)))
        md += [f"![files/s vs readers, ~110 KB files]({rel})", ""]
    md.append(DOC_END)
    return tables, "\n".join(md) + "\n"


def write_plot(path: str, res: dict, readers: List[int], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    styles = {"direct": ("k", "-", "o")}
    for key in ["direct"] + [c[0] for c in CASES]:
        if key not in res:
            continue
        color, ls, marker = styles.get(key, (None, "--" if "single" in key else "-",
                                              "s" if key.startswith("ram") else "^" if key.startswith("nvme") else "v"))
        ax.plot(readers, [res[key][r]["files_s"] for r in readers], label=LABELS[key], color=color,
                linestyle=ls, marker=marker)
    ax.set_yscale("log")
    ax.set_xticks(readers)
    ax.set_xlabel("reader processes")
    ax.set_ylabel("files/s (log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
