"""Chaos drill: a real `strata serve` (API, private Redis with AOF, two coordinators, CPU workers) renders a stream
of small jobs of both cameras while a driver SIGKILLs GPU workers, a coordinator, the API and Redis at random and
restarts the whole service; afterwards every job must be done (failed only for bad input), byte-identical to a
fault-free run of the same shots, with no job stuck and no orphan files.

    strata chaos --minutes 10 --kills 40          # the operator's long run (docs/OPERATIONS.md)
    strata chaos --jobs 24 --kills 8 --json r.json  # about what CI runs (tests/chaos)

Recovery is measured per kill: for a GPU worker, until the shard it held is done; for a coordinator (a busy one,
by the jobs its heartbeat holds), until the ingests or finalizes it held moved on; for the API, Redis and a whole
restart, until ``/readyz`` answers 200. The longest stall is the longest time with work in flight but no shard or
job finishing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

from services.db.models import Job, Shard

KINDS = ("gpu", "coordinator", "api", "redis", "service")
WEIGHTS = {"gpu": 4, "coordinator": 3, "api": 1, "redis": 1, "service": 1}
ACTIVE = ("queued", "running")


@dataclass
class Shot:
    name: str
    camera: str
    files: list[Path]
    bad: bool = False  # a truncated upload: must fail (or be refused), never hang


@dataclass
class Kill:
    kind: str
    at: float  # seconds since the chaos phase started
    target: str
    recovered_s: float | None = None


@dataclass
class Report:
    jobs: int = 0
    kills: list[Kill] = field(default_factory=list)
    done: int = 0
    failed_bad_input: int = 0
    refused_bad_input: int = 0
    lost: list[str] = field(default_factory=list)  # jobs not done (or failed without bad input), with why
    differing: list[str] = field(default_factory=list)  # outputs not byte-identical to the fault-free run
    orphans: list[str] = field(default_factory=list)
    longest_stall_s: float = 0.0
    drain_after_last_kill_s: float = 0.0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.differing or self.orphans)

    def recovery(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind in KINDS:
            got = sorted(k.recovered_s for k in self.kills if k.kind == kind and k.recovered_s is not None)
            if got:
                out[kind] = {"n": len(got), "median_s": round(got[len(got) // 2], 1), "max_s": round(got[-1], 1)}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "recovery": self.recovery()}


def make_shots(folder: Path, scale: float, seed: int = 0) -> list[Shot]:
    """Distinct shots of both cameras (IQ3_S single frames, IQ2_XS 3-frame stacks) and one bad upload."""
    from lab.synth.synth import synthesize_shot

    shots = []
    for i, (camera, frames) in enumerate((("IQ3_S", None), ("IQ2_XS", 3), ("IQ3_S", None), ("IQ2_XS", 3))):
        made = synthesize_shot(camera, folder / f"shot{i}", scale=scale, frames=frames, seed=seed + i,
                               noise="low")
        shots.append(Shot(f"shot{i}-{camera}", camera, list(made.files)))
    bad = folder / "bad" / "truncated.dng"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(shots[0].files[0].read_bytes()[:4096])
    shots.append(Shot("bad", "IQ3_S", [bad], bad=True))
    return shots


class Service:
    """One `strata serve` on ``data_dir`` and ``port``, as an operator runs it (SQLite, private Redis)."""

    def __init__(self, data_dir: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.data_dir, self.port = data_dir.resolve(), port
        self.url = f"http://127.0.0.1:{port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
        self.env = {**base, "STRATA_CPU_WORKERS": "2", "STRATA_TORCH_THREADS": "1", "STRATA_LOG_LEVEL": "INFO",
                    "PYTHONUNBUFFERED": "1", "STRATA_REMEMBER_LAST_SERVICE": "false", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_s: float = 180) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "serve.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--data-dir", str(self.data_dir),
                                      "--port", str(self.port)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if not self.wait_ready(ready_s):
            raise RuntimeError(f"strata serve not ready after {ready_s:.0f} s; see {self.data_dir / 'serve.log'}")
        self.check_private_redis()

    def check_private_redis(self, timeout: float = 30) -> None:
        """The drill kills the service's own Redis: its workers must be using that one (their heartbeats in it),
        not some other Redis of the machine."""
        import re

        import redis

        ports = re.findall(r"started a private Redis on 127\.0\.0\.1:(\d+)", (self.data_dir / "serve.log").read_text())
        if not ports:
            raise RuntimeError("strata serve started no private Redis (is STRATA_REDIS_URL set?)")
        client = redis.Redis(port=int(ports[-1]), socket_timeout=2)
        deadline = time.monotonic() + timeout
        while not any(True for _ in client.scan_iter(match="strata:workers:*", count=100)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker heartbeat in the service's private Redis (port {ports[-1]})")
            time.sleep(0.25)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return True
            time.sleep(0.25)
        return False

    def token(self) -> str:
        return (self.data_dir / "local-token").read_text().strip()

    def coordinator_jobs(self) -> dict[str, list[str]]:
        """What each live coordinator's heartbeat holds (its leases), from `GET /v1/workers`; {} when unknown."""
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
            resp = httpx.get(f"{self.url}/v1/workers", headers={"Authorization": f"Bearer {self.token()}"},
                             timeout=2)
            if resp.status_code == 200:
                return {w["name"]: list(w.get("jobs") or []) for w in resp.json()["workers"]
                        if w["kind"] == "coordinator"}
        return {}

    def children(self, kind: str) -> list[psutil.Process]:
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [p for p in psutil.Process(self.proc.pid).children() if _kind_of(p) == kind]
        return []

    def crash(self) -> None:
        """SIGKILL the supervisor and every child at once (a power cut of the service, not of the disk)."""
        if self.proc is None:
            return
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for p in family:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.crash()
        self.proc = None


def _kind_of(proc: psutil.Process) -> str | None:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    text = " ".join(argv)
    if "valkey-server" in text or "redis-server" in text:
        return "redis"
    if "uvicorn" in text:
        return "api"
    if "-n" in argv and "celery" in text:
        name = argv[argv.index("-n") + 1]
        return "coordinator" if name.startswith("coordinator") else "gpu"  # coordinator@h, coordinator2@h, ...
    return None


class Db:
    """Read-only look at the service's SQLite database (what the driver checks; it never writes)."""

    def __init__(self, data_dir: Path) -> None:
        self.engine: Engine = create_engine(f"sqlite:///{data_dir.resolve() / 'strata.db'}")

    def session(self) -> Session:
        return Session(self.engine)

    def progress(self) -> tuple[int, int]:
        """(done shards + ended jobs, jobs in flight)."""
        with self.session() as s:
            shards = s.scalar(select(func.count()).select_from(Shard).where(Shard.status == "done")) or 0
            ended = s.scalar(select(func.count()).select_from(Job).where(Job.status.not_in(ACTIVE))) or 0
            active = s.scalar(select(func.count()).select_from(Job).where(Job.status.in_(ACTIVE))) or 0
        return shards + ended, active

    def busy_workers(self) -> set[str]:
        with self.session() as s:
            return set(s.scalars(select(Shard.worker).where(Shard.status == "running")))

    def held_by(self, target: str) -> Callable[[], bool] | None:
        """The shards a GPU worker holds now (``*``: any worker), as a test that says when someone else has finished
        them (None: it holds nothing)."""
        with self.session() as s:
            who = Shard.worker.is_not(None) if target == "*" else Shard.worker == target
            ids = list(s.scalars(select(Shard.id).where(Shard.status == "running", who)))
        return (lambda: self._shards_moved(ids)) if ids else None

    def jobs_held(self, job_ids: list[str]) -> Callable[[], bool] | None:
        """Jobs a coordinator holds (ingesting or advancing), as a test that says when they moved on: to another
        phase or ended (None: none of them is still running)."""
        with self.session() as s:
            jobs = {j.id: j.phase for j in s.scalars(select(Job).where(Job.id.in_(job_ids), Job.status.in_(ACTIVE)))}
        return (lambda: self._jobs_moved(jobs)) if jobs else None

    def _shards_moved(self, ids: list[int]) -> bool:
        with self.session() as s:
            rows = s.execute(select(Shard.status, Job.status).join(Job).where(Shard.id.in_(ids))).all()
        return all(shard == "done" or job not in ACTIVE for shard, job in rows)

    def _jobs_moved(self, jobs: dict[str, int]) -> bool:
        with self.session() as s:
            rows = s.execute(select(Job.id, Job.phase, Job.status).where(Job.id.in_(list(jobs)))).all()
        return all(status not in ACTIVE or phase != jobs[jid] for jid, phase, status in rows)


@dataclass
class Drill:
    """Settings of one run."""

    data_dir: Path
    port: int
    jobs: int = 24
    kills: int = 8
    minutes: float | None = None  # submit for this long instead of a job count
    seed: int = 0
    scale: float = 0.03
    timeout_s: float = 900.0  # for every job to end after the last submission
    bad_every: int = 10  # every n-th job is a bad upload
    gap_s: float = 1.5  # mean seconds between submissions
    env: dict[str, str] = field(default_factory=dict)


class Driver:
    def __init__(self, drill: Drill, service: Service, shots: list[Shot]) -> None:
        self.drill, self.service, self.shots = drill, service, shots
        self.db = Db(drill.data_dir)
        self.rng = random.Random(drill.seed)
        self.report = Report()
        self.submitted: dict[str, Shot] = {}  # job id -> its shot
        self.t0 = time.monotonic()
        self.lock = threading.Lock()  # a whole-service restart and a submission never overlap
        self.watches: list[tuple[Kill, float, Callable[[], bool]]] = []
        self.first_round = self.rng.sample(list(KINDS), len(KINDS))

    def submit(self, shot: Shot, attempts: int = 120) -> str | None:
        """Upload a shot as a job, retrying while the service is down; the job id (None: refused, bad input)."""
        for _ in range(attempts):
            with self.lock, contextlib.suppress(httpx.HTTPError):
                job = self._post(shot)
                if job is not None:
                    return str(job) if job else None
            time.sleep(1.0)
        raise RuntimeError(f"could not submit {shot.name} for {attempts} s")

    def _post(self, shot: Shot) -> str | bool | None:
        """The new job's id; False when refused as bad input; None to try again (service away)."""
        handles = [open(p, "rb") for p in shot.files]  # noqa: SIM115 - closed below
        try:
            resp = httpx.post(f"{self.service.url}/v1/jobs", data={"priority": "interactive"}, timeout=60,
                              headers={"Authorization": f"Bearer {self.service.token()}"},
                              files=[("frames", (p.name, f, "application/octet-stream"))
                                     for p, f in zip(shot.files, handles, strict=True)])
        finally:
            for f in handles:
                f.close()
        if resp.status_code == 202:
            return str(resp.json()["id"])
        if 400 <= resp.status_code < 500 and shot.bad:
            self.report.refused_bad_input += 1
            return False
        return None  # 5xx / 503 while Redis or the database is away: again

    def next_kind(self) -> str:
        """Every kind once (in a random order), then at random by :data:`WEIGHTS`."""
        if self.first_round:
            return self.first_round.pop()
        return self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]

    def kill_one(self) -> None:
        kind = self.next_kind()
        if kind in ("gpu", "coordinator"):  # aim at work in progress (a few seconds at most), to measure recovery
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not (
                    self.db.held_by("*") if kind == "gpu" else any(self.service.coordinator_jobs().values())):
                time.sleep(0.1)
        at = time.monotonic() - self.t0
        if kind == "service":
            with self.lock:
                self.service.crash()
                kill = Kill(kind, at, "strata serve")
                self.service.start()
                kill.recovered_s = time.monotonic() - self.t0 - at
            self.report.kills.append(kill)
            return
        procs = self.service.children(kind)
        if not procs:
            return
        leases = self.service.coordinator_jobs() if kind == "coordinator" else {}
        busy = self.db.busy_workers() if kind == "gpu" else {n for n, jobs in leases.items() if jobs}
        proc = self.rng.choice([p for p in procs if _node_name(p) in busy] or procs)  # a busy one if any
        target = _node_name(proc)
        held = (self.db.held_by(target) if kind == "gpu"
                else self.db.jobs_held(leases.get(target, [])) if kind == "coordinator" else None)
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
        kill = Kill(kind, at, target)
        self.report.kills.append(kill)
        self.watches.append((kill, time.monotonic(), held or (lambda: self.service.wait_ready(0.5))))
        if held is None and kind in ("gpu", "coordinator"):
            self.watches.pop()  # it held nothing: no recovery to measure

    def check_watches(self) -> None:
        for item in list(self.watches):
            kill, t, finished = item
            with contextlib.suppress(Exception):
                if finished():
                    kill.recovered_s = time.monotonic() - t
                    self.watches.remove(item)


def _node_name(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error, ValueError, IndexError):
        argv = proc.cmdline()
        return argv[argv.index("-n") + 1]
    return _kind_of(proc) or "?"


def _monitor(driver: Driver, stop: threading.Event) -> None:
    """Every second: the longest time with jobs in flight but nothing finishing; recoveries of the kills."""
    last_progress, since = -1, time.monotonic()
    while not stop.wait(1.0):
        driver.check_watches()
        with contextlib.suppress(Exception):
            progress, active = driver.db.progress()
            now = time.monotonic()
            if progress != last_progress or active == 0:
                last_progress, since = progress, now
            driver.report.longest_stall_s = max(driver.report.longest_stall_s, round(now - since, 1))


def _submit_stream(driver: Driver, deadline: float | None, gap_s: float) -> None:
    good = [s for s in driver.shots if not s.bad]
    bad = [s for s in driver.shots if s.bad]
    i = 0
    while (i < driver.drill.jobs) if deadline is None else (time.monotonic() < deadline):
        i += 1
        shot = bad[0] if bad and i % driver.drill.bad_every == 0 else good[i % len(good)]
        job_id = driver.submit(shot)
        if job_id is not None:
            driver.submitted[job_id] = shot
        time.sleep(driver.rng.uniform(0, 2 * gap_s))


def _kill_loop(driver: Driver, submitter: threading.Thread, interval_s: float) -> None:
    while len(driver.report.kills) < driver.drill.kills:
        time.sleep(driver.rng.uniform(0.5, 1.5) * interval_s)
        before = len(driver.report.kills)
        driver.kill_one()
        if len(driver.report.kills) == before:  # nothing of that kind running right now: try another soon
            time.sleep(0.5)
        if not submitter.is_alive() and not driver.db.progress()[1]:
            break  # all work ended: later kills would test nothing


def wait_all_ended(db: Db, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.progress()[1] == 0:
            return True
        time.sleep(1.0)
    return False


def baseline(driver: Driver, timeout: float) -> dict[str, list[tuple[str, str]]]:
    """A fault-free run of every good shot: its outputs' (name, sha256)."""
    ids = {s.name: driver.submit(s) for s in driver.shots if not s.bad}
    if not wait_all_ended(driver.db, timeout):
        raise RuntimeError("the fault-free run did not finish")
    out = {}
    with driver.db.session() as s:
        for name, job_id in ids.items():
            job = s.get(Job, job_id)
            if job is None or job.status != "done":
                raise RuntimeError(f"fault-free run of {name}: {job and job.status} {job and job.error}")
            out[name] = _outputs(driver.drill.data_dir, job)
    return out


def _outputs(data_dir: Path, job: Job) -> list[tuple[str, str]]:
    """(name, sha256 of the stored file) of a job's outputs; the file must hash to what the database says."""
    got = []
    for o in sorted(job.outputs, key=lambda o: o.name):
        path = data_dir / "storage" / o.storage_key
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        got.append((o.name, digest if digest == o.sha256 else f"{digest} (database: {o.sha256})"))
    return got


def verify(driver: Driver, expected: dict[str, list[tuple[str, str]]], baseline_ids: set[str]) -> None:
    """Every job of the chaos phase (also one a failed POST created) is done and byte-identical, or failed
    for bad input."""
    by_upload = {hashlib.sha256(s.files[0].read_bytes()).hexdigest(): s for s in driver.shots}
    report = driver.report
    with driver.db.session() as s:
        jobs = [j for j in s.scalars(select(Job)) if j.id not in baseline_ids]
        report.jobs = len(jobs)
        for job in jobs:
            first = min(job.frames, key=lambda f: f.index) if job.frames else None
            shot = by_upload.get(first.sha256) if first else None
            _judge(report, driver.drill.data_dir, job, shot, expected)
    report.orphans = find_orphans(driver.drill.data_dir, driver.db)


def _judge(report: Report, data_dir: Path, job: Job, shot: Shot | None,
           expected: dict[str, list[tuple[str, str]]]) -> None:
    if job.status in ACTIVE:
        report.lost.append(f"{job.id}: still {job.status} ({job.stage})")
    elif shot is not None and shot.bad:
        if job.status == "failed":
            report.failed_bad_input += 1
        else:
            report.lost.append(f"{job.id}: bad input ended {job.status}")
    elif job.status != "done" or shot is None:
        report.lost.append(f"{job.id}: {job.status}: {job.error}")
    else:
        report.done += 1
        got = _outputs(data_dir, job)
        if got != expected[shot.name]:
            report.differing.append(f"{job.id} ({shot.name}): {got} != {expected[shot.name]}")


def find_orphans(data_dir: Path, db: Db) -> list[str]:
    """Intermediates and half-written files left in the folders of jobs that ended."""
    from services.storage.keys import INTERMEDIATE_FOLDERS

    root = data_dir / "storage"
    with db.session() as s:
        ended = set(s.scalars(select(Job.id).where(Job.status.not_in(ACTIVE))))
    orphans = []
    for job_id in ended:
        folder = root / "jobs" / job_id
        for p in folder.rglob("*") if folder.is_dir() else []:
            partial = p.name.startswith(".part-") or p.name.endswith(".part")
            if p.is_file() and (partial or p.relative_to(folder).parts[0] in INTERMEDIATE_FOLDERS):
                orphans.append(str(p.relative_to(root)))
    return orphans


def run(drill: Drill, log: Callable[[str], None] = print) -> Report:
    """The whole drill: shots, the service, a fault-free run, the chaos phase, the checks."""
    t0 = time.monotonic()
    shots = make_shots(drill.data_dir / "shots", drill.scale, drill.seed)
    service = Service(drill.data_dir / "service", drill.port, drill.env)
    service.start()
    driver = Driver(drill, service, shots)
    driver.db = Db(service.data_dir)
    driver.drill = Drill(**{**asdict(drill), "data_dir": service.data_dir})
    try:
        expected = baseline(driver, drill.timeout_s)
        with driver.db.session() as s:
            baseline_ids = set(s.scalars(select(Job.id)))
        log(f"fault-free run: {len(expected)} shots rendered; chaos phase starts")
        _chaos_phase(driver, drill)
        verify(driver, expected, baseline_ids)
    finally:
        service.stop()
    driver.report.seconds = round(time.monotonic() - t0, 1)
    return driver.report


def _chaos_phase(driver: Driver, drill: Drill) -> None:
    gap_s = drill.gap_s
    span = drill.minutes * 60 if drill.minutes else drill.jobs * gap_s
    driver.t0 = time.monotonic()
    stop = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(driver, stop), daemon=True)
    monitor.start()
    submitter = threading.Thread(target=_submit_stream, daemon=True, args=(
        driver, None if drill.minutes is None else time.monotonic() + span, gap_s))
    submitter.start()
    _kill_loop(driver, submitter, span / max(drill.kills, 1))
    submitter.join()
    last_kill = time.monotonic()
    ended = wait_all_ended(driver.db, drill.timeout_s)
    driver.report.drain_after_last_kill_s = round(time.monotonic() - last_kill, 1)
    time.sleep(2.0)  # the last recoveries are noted
    stop.set()
    monitor.join()
    if not ended:
        driver.report.lost.append(f"jobs still in flight {drill.timeout_s:.0f} s after the last submission")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="strata chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=None, help="submit jobs for this long (else --jobs)")
    ap.add_argument("--jobs", type=int, default=24, help="jobs to submit when --minutes is not given")
    ap.add_argument("--kills", type=int, default=8, help="random SIGKILLs (and whole-service restarts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.03, help="linear size of the synthetic shots")
    ap.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    ap.add_argument("--data-dir", type=Path, default=None, help="where the drill's service lives (default: temp)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for the jobs to end after the stream")
    ap.add_argument("--gap", type=float, default=1.5, help="mean seconds between submissions")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="setting of the service, e.g. STRATA_FAULT_SHARD_DELAY_S=0.5 (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    from workers.launcher import free_port

    args = _parser().parse_args(argv)
    with contextlib.ExitStack() as stack:
        data = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-chaos-")))
        drill = Drill(data_dir=data, port=args.port or free_port(), jobs=args.jobs, kills=args.kills,
                      minutes=args.minutes, seed=args.seed, scale=args.scale, timeout_s=args.timeout, gap_s=args.gap,
                      env=dict(e.split("=", 1) for e in args.env))
        report = run(drill, log=lambda m: print(m, file=sys.stderr, flush=True))
    text = json.dumps(report.to_dict(), indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0 if report.ok else 1
