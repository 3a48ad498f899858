"""Where a batch's jobs waited: per job, from a service's logs (``OUT/logs.tgz`` of session_bench.sh, unpacked),
its ingest, the wait for a GPU thread, the strip, the wait for a coordinator slot and the finalize (seconds from
the first ingest), then how many jobs each stage held over time (a histogram sampled every 50 ms).

Usage: python scripts/gpu/job_timeline.py LOGS_DIR
"""
import datetime as dt
import glob
import re
import sys

import numpy as np


def ts(line: str) -> float:
    return dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def main(logs: str) -> None:
    ev: dict[str, dict[str, tuple[float, float]]] = {}
    lines: list[str] = []
    for f in glob.glob(logs + "/*.log"):
        with open(f) as handle:
            lines += handle.readlines()
    for line in lines:
        m = re.search(r"job ([0-9a-f]{32}) ingested: .*decoded in ([0-9.]+)s, planned in ([0-9.]+)s", line)
        if m:
            ev.setdefault(m[1], {})["ing"] = (ts(line) - float(m[2]) - float(m[3]), ts(line))
        m = re.search(r"shard ([0-9a-f]{32})/\d+/\d+ done on \S+ .* in ([0-9.]+)s", line)
        if m:
            ev.setdefault(m[1], {})["gpu"] = (ts(line) - float(m[2]), ts(line))
        m = re.search(r"job ([0-9a-f]{32}) done: .*recorded in ([0-9.]+)s; final preview ([0-9.]+)s, "
                      r"intermediates removed ([0-9.]+)s", line)
        if m:
            ev.setdefault(m[1], {})["fin"] = (ts(line) - float(m[2]) - float(m[3]) - float(m[4]), ts(line))
    jobs = sorted([e for e in ev.values() if len(e) == 3], key=lambda e: e["ing"][0])
    if not jobs:
        sys.exit(f"no single-strip job with all three stages logged in {logs}")
    t0 = jobs[0]["ing"][0]
    for e in jobs:
        i, g, f = e["ing"], e["gpu"], e["fin"]
        print(f"ingest {i[0] - t0:6.2f}-{i[1] - t0:6.2f}  wait {g[0] - i[1]:5.2f}  strip {g[0] - t0:6.2f}-"
              f"{g[1] - t0:6.2f} ({g[1] - g[0]:.2f})  wait {f[0] - g[1]:5.2f}  finalize {f[0] - t0:6.2f}-"
              f"{f[1] - t0:6.2f} ({f[1] - f[0]:.2f})  total {f[1] - i[0]:.2f}")
    times = np.arange(0, max(e["fin"][1] for e in jobs) - t0, 0.05)
    for k, name in (("ing", "ingest"), ("gpu", "strip"), ("fin", "finalize")):
        held = np.array([sum(1 for e in jobs if e[k][0] - t0 <= t < e[k][1] - t0) for t in times])
        print(f"{name}: jobs at once, samples with 0, 1, 2, ...: {np.bincount(held).tolist()}")


if __name__ == "__main__":
    main(sys.argv[1])
