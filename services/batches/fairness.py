"""Per-station fairness in the batch lane: which waiting shots to admit next."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict, deque
from dataclasses import dataclass

EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Candidate:
    """A shot waiting for admission."""

    job_id: str
    station_id: str
    created_at: dt.datetime


def fair_order(candidates: list[Candidate], last_admitted: dict[str, dt.datetime], n: int) -> list[Candidate]:
    """Up to ``n`` candidates, round-robin across stations, oldest first within a station.

    The turn goes to the station served least recently (``last_admitted``, from the jobs' ``admitted_at`` in the
    database, so the rotation holds across passes and restarts); a station never served goes first, ties by its
    oldest waiting shot. One station's 1,000 shots therefore do not starve another's 10.
    """
    queues: dict[str, deque[Candidate]] = defaultdict(deque)
    for c in sorted(candidates, key=lambda c: (c.created_at, c.job_id)):
        queues[c.station_id].append(c)
    served = {s: last_admitted.get(s, EPOCH) for s in queues}
    picked: list[Candidate] = []
    tick = 0
    while len(picked) < n and queues:
        station = min(queues, key=lambda s: (served[s], queues[s][0].created_at, s))
        picked.append(queues[station].popleft())
        tick += 1
        served[station] = dt.datetime.max.replace(tzinfo=dt.UTC) - dt.timedelta(days=1) + dt.timedelta(seconds=tick)
        if not queues[station]:
            del queues[station]
    return picked
