"""How full a GPU worker's device slots were during a batch, from its log (``OUT/logs.tgz`` of session_bench.sh,
unpacked: ``logs/gpu0.log``). Each strip's log line, written once its results are stored, gives its time holding a
device slot (rendered and downloaded, less the wait for a slot) and the store after it, so each hold's start and
end follow from the line's stamp. Over the batch's dense part (from the ``--skip``-th batch strip's start to the
``--skip``-th last one's end: no fill, no tail) it prints the share of time 0, 1, 2, 3+ slots were held (batch and
interactive strips alike), the mean hold of a batch strip and its bins and tiles on the device; a rate bound follows:
slots / mean hold. Session 44 found the two slots (``STRATA_GPU_WORKER_THREADS``) held 92-99 % of a 100-shot batch
this way, each strip 0.53-0.55 s: the 3.7 frames/s the batch ran at.

Usage: python scripts/gpu/slot_occupancy.py LOGS/gpu0.log [--skip 5] [--json F]
"""
import argparse
import datetime as dt
import json
import re

LINE = re.compile(r"^\[(\S+ \S+): .*strip \S+ ?(\(interactive\))?: rendered and downloaded in ([0-9.]+)s \(of which "
                  r"waiting for a device slot ([0-9.]+)s, bins and tiles on the device ([0-9.]+)s, paused for "
                  r"interactive shards ([0-9.]+)s\), bins and tiles stored in ([0-9.]+)s")


def holds(path: str) -> list[dict]:
    """Each strip's slot hold: start, end (epoch seconds), interactive or not, bins and tiles on the device."""
    out = []
    with open(path) as handle:
        for line in handle:
            m = LINE.search(line)
            if not m:
                continue
            stamp = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            rendered, waited, tiles, stored = float(m[3]), float(m[4]), float(m[5]), float(m[7])
            end = stamp - stored
            out.append({"start": end - (rendered - waited), "end": end, "interactive": bool(m[2]), "tiles": tiles})
    return out


def occupancy(strips: list[dict], lo: float, hi: float) -> dict[int, float]:
    """Share of [lo, hi] during which 0, 1, 2 and 3 or more slots were held."""
    events = sorted([(max(s["start"], lo), 1) for s in strips if s["end"] > lo and s["start"] < hi]
                    + [(min(s["end"], hi), -1) for s in strips if s["end"] > lo and s["start"] < hi])
    shares = dict.fromkeys(range(4), 0.0)
    held, last = 0, lo
    for t, step in events:
        shares[min(held, 3)] += t - last
        held, last = held + step, t
    shares[min(held, 3)] += hi - last
    return {k: v / (hi - lo) for k, v in shares.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--skip", type=int, default=5, help="batch strips left out at each end (fill and tail)")
    parser.add_argument("--json")
    args = parser.parse_args()
    strips = holds(args.log)
    batch = sorted((s for s in strips if not s["interactive"]), key=lambda s: s["start"])
    if len(batch) <= 2 * args.skip + 1:
        raise SystemExit(f"{len(batch)} batch strips in {args.log}: too few for --skip {args.skip}")
    lo, hi = batch[args.skip]["start"], max(s["end"] for s in batch[: len(batch) - args.skip])
    shares = occupancy(strips, lo, hi)
    hold = sum(s["end"] - s["start"] for s in batch) / len(batch)
    tiles = sum(s["tiles"] for s in batch) / len(batch)
    result = {"batch_strips": len(batch), "window_s": hi - lo, "slots_held_share": shares,
              "mean_hold_s": hold, "mean_bins_and_tiles_s": tiles}
    print(f"{len(batch)} batch strips; window {hi - lo:.1f} s; slots held 0 / 1 / 2 / 3+: "
          + " / ".join(f"{shares[k]:.0%}" for k in range(4))
          + f"; a batch strip holds a slot {hold:.3f} s on average, {tiles:.3f} s of it bins and tiles")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
