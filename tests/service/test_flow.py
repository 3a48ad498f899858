"""The job state machine's database decisions: idempotent phase moves and the lost-work reconciler."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import event, update

from services.db.models import Job, Shard, Station, utcnow
from services.db.session import session_scope
from services.errors import IntermediateLost
from services.jobs import flow
from services.jobs.quiet import KEY, QuietWindow
from services.jobs.reconcile import reconcile
from services.jobs.tickets import ShardTicket
from services.storage.keys import shard_key


def _job(session, *, status: str = "running", phase: int = 0, age_s: float = 600,  # type: ignore[no-untyped-def]
         admitted: bool = True) -> Job:
    station = Station(name=f"s-{utcnow().timestamp()}", token_hash=str(utcnow().timestamp()))
    session.add(station)
    session.flush()
    created = utcnow() - dt.timedelta(seconds=age_s)
    job = Job(station_id=station.id, status=status, camera="IQ3_S", recipe="tiff16", priority="batch",
              phase=phase, created_at=created, admitted_at=created if admitted else None, updated_at=created,
              params={"plan": [{"kind": "strip"}], "n_workers": 2, "size": [100, 100]})
    session.add(job)
    session.flush()
    return job


def _stack_job(paths: list[Path], station_name: str, camera: str = "IQ2_XS", recipes: tuple[str, ...] = (),
               priority: str | None = None) -> str:
    """Store ``paths`` as a job's uploads and create the job (IQ2_XS unless told), as the API does; returns its
    id."""
    import hashlib
    import uuid

    from services.jobs.service import ReceivedFile, create_job
    from services.storage import get_storage

    storage = get_storage()
    job_id = uuid.uuid4().hex
    files = []
    for path in paths:
        key = f"uploads/{job_id}/{path.name}"
        with storage.writer(key) as f:
            f.write(path.read_bytes())
        files.append(ReceivedFile(path.name, key, hashlib.sha256(path.read_bytes()).hexdigest(),
                                  path.stat().st_size, camera))
    with session_scope() as session:
        station = Station(name=station_name, token_hash=station_name)
        session.add(station)
        session.flush()
        create_job(session, station, job_id, files, camera=camera, recipe=None, priority=priority, sha256=[],
                   recipes=recipes)
    return job_id


def test_reconcile_finds_lost_shards_stalled_phases_and_lost_ingests(db: str) -> None:
    old = utcnow() - dt.timedelta(seconds=600)
    with session_scope() as session:
        lost = _job(session)
        session.add_all([
            Shard(job_id=lost.id, phase=0, index=0, kind="strip", status="running", worker="dead@h", started_at=old),
            Shard(job_id=lost.id, phase=0, index=1, kind="strip", status="running", worker="gpu0@h", started_at=old),
            Shard(job_id=lost.id, phase=0, index=2, kind="strip", status="done", worker="gpu0@h", started_at=old,
                  finished_at=old),
        ])
        stalled = _job(session)
        session.add(Shard(job_id=stalled.id, phase=0, index=0, kind="strip", status="done", finished_at=old))
        fresh = _job(session, age_s=1)
        session.add(Shard(job_id=fresh.id, phase=0, index=0, kind="strip", status="running", worker="dead@h",
                          started_at=utcnow()))
        never = _job(session, status="queued", phase=-1)
        waiting = _job(session, status="queued", phase=-1, admitted=False)  # waits for admission: never sent, not lost
        done = _job(session, status="done")
        session.add(Shard(job_id=done.id, phase=0, index=0, kind="strip", status="running", worker="dead@h",
                          started_at=old))
        ids = {"lost": lost.id, "stalled": stalled.id, "never": never.id, "waiting": waiting.id}
    loaded: list[str] = []

    def record(job: Job, _context: object) -> None:
        loaded.append(job.id)

    event.listen(Job, "load", record)
    with session_scope() as session:
        try:
            repairs = reconcile(session, alive_workers={"gpu0@h"}, coordinator_backlog=0, stale_after_s=60)
        finally:
            event.remove(Job, "load", record)
        # the one waiting for admission is not even read: a night's thousands of shots waiting made every pass load
        # them all (found from outside)
        assert ids["never"] in loaded and ids["waiting"] not in loaded
        shard_jobs = {session.get(Shard, t.shard_id).job_id for t in repairs.shards}
        assert shard_jobs == {ids["lost"]} and len(repairs.shards) == 1
        assert repairs.advance == [(ids["stalled"], "batch")]
        assert repairs.ingest == [(ids["never"], "batch")]
        # A busy coordinator queue means the ingest message is probably still waiting: leave it.
        busy = reconcile(session, alive_workers={"gpu0@h"}, coordinator_backlog=3, stale_after_s=60)
        assert busy.ingest == []


def test_reconcile_with_leases_redispatches_at_once_what_no_heartbeat_holds(db: str) -> None:
    """Leases: a shard running on a worker that restarted under the same name (its heartbeat holds another shard),
    a job decoding on a dead coordinator and a finished phase nobody advances are all repaired within seconds,
    once each; what a live heartbeat holds is left alone."""
    from services.jobs.reconcile import Held

    recent = utcnow() - dt.timedelta(seconds=10)
    with session_scope() as session:
        job = _job(session)
        lost = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="running", worker="gpu0@h",
                     started_at=recent, attempts=1)
        held = Shard(job_id=job.id, phase=0, index=1, kind="strip", status="running", worker="gpu1@h",
                     started_at=recent, attempts=1)
        session.add_all([lost, held])
        decoding = _job(session, status="running", phase=-1)
        decoding_held = _job(session, status="running", phase=-1)
        stalled = _job(session)
        session.add(Shard(job_id=stalled.id, phase=0, index=0, kind="strip", status="done", finished_at=recent))
        session.flush()
        ids = {"lost": lost.id, "held": held.id, "decoding": decoding.id, "stalled": stalled.id}
        leases = Held(frozenset({"gpu0@h", "gpu1@h"}), frozenset({held.id}), frozenset({decoding_held.id}))
    with session_scope() as session:
        repairs = reconcile(session, alive_workers={"gpu0@h", "gpu1@h"}, coordinator_backlog=0, stale_after_s=600,
                            held=lambda: leases, grace_s=5)
        assert [t.shard_id for t in repairs.shards] == [ids["lost"]]
        assert repairs.ingest == [(ids["decoding"], "batch")]
        assert repairs.advance == [(ids["stalled"], "batch")]
        assert session.get(Shard, ids["lost"]).status == "pending"
        assert session.get(Shard, ids["held"]).status == "running"
        assert session.get(Job, ids["decoding"]).status == "queued"
        again = reconcile(session, alive_workers={"gpu0@h", "gpu1@h"}, coordinator_backlog=0, stale_after_s=600,
                          held=lambda: leases, grace_s=5)
        assert again.shards == [] and again.ingest == []  # sent once: no pile of duplicates


def test_leases_handed_back_by_a_supervisor_are_repaired_at_once(db: str) -> None:
    """A worker its supervisor saw die handed back its leases (``abandoned``): its shard started a moment ago, the
    finalize it was running while the coordinator queue is busy, and the ingest it had taken off the queue before
    marking the job running are all re-dispatched at the next pass, not after the heartbeat grace or the lost-
    message timeout; the same rows without the hand-back wait, and a job another live coordinator holds is left
    alone."""
    from services.jobs.reconcile import Held

    just_now = utcnow() - dt.timedelta(seconds=1)
    with session_scope() as session:
        job = _job(session)
        shard = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="running", worker="gpu0@h",
                      started_at=just_now, attempts=1)
        session.add(shard)
        finalizing = _job(session, phase=1)
        session.add(Shard(job_id=finalizing.id, phase=0, index=0, kind="strip", status="done", finished_at=just_now))
        taken = _job(session, status="queued", phase=-1, age_s=2)
        retaken = _job(session, status="queued", phase=-1, age_s=2)
        session.flush()
        ids = {"shard": shard.id, "finalizing": finalizing.id, "taken": taken.id, "retaken": retaken.id}
    alive = frozenset({"gpu1@h", "coordinator2@h"})
    plain = Held(alive, frozenset(), frozenset({ids["retaken"]}))
    handed_back = Held(alive, frozenset(), frozenset({ids["retaken"]}),
                       frozenset({ids["finalizing"], ids["taken"], ids["retaken"]}), frozenset({ids["shard"]}))
    with session_scope() as session:
        waits = reconcile(session, alive_workers=set(alive), coordinator_backlog=4, stale_after_s=30,
                          held=lambda: plain, grace_s=6)
        assert waits.shards == [] and waits.advance == [] and waits.ingest == []
        repairs = reconcile(session, alive_workers=set(alive), coordinator_backlog=4, stale_after_s=30,
                            held=lambda: handed_back, grace_s=6)
        assert [t.shard_id for t in repairs.shards] == [ids["shard"]]
        assert repairs.advance == [(ids["finalizing"], "batch")]
        assert repairs.ingest == [(ids["taken"], "batch")]  # "retaken": a live coordinator holds it again
        assert session.get(Shard, ids["shard"]).status == "pending"


def test_a_pending_shard_handed_back_by_a_supervisor_is_sent_again_at_once(db: str) -> None:
    """Found from outside: a GPU worker SIGKILLed after taking a shard's message and listing the shard in its
    heartbeat, but before marking it running, left the shard pending with its message unacknowledged. Its supervisor
    handed the shard back, yet the reconciler ignored the hand-back for pending shards: one pinned to the dead
    worker's own queue (STRATA_SPLIT_RATIO) waited for the lost-message timeout (30 s), one of the shared queue for
    that queue to empty (never, while a batch runs). Handed back, held by no live heartbeat: re-dispatched at the
    next pass, once; without the hand-back, or while a live worker holds it again, it waits as before."""
    from services.jobs.reconcile import Held

    just_now = utcnow() - dt.timedelta(seconds=1)
    with session_scope() as session:
        ids = {}
        for name, payload in (("shared", {}), ("pinned", {"gpu_slot": 1})):
            job = _job(session, age_s=1)
            shard = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="pending", payload=payload,
                          started_at=None)
            session.add(shard)
            session.flush()
            ids[name] = shard.id
            session.execute(update(Job).where(Job.id == job.id).values(updated_at=just_now))
        retaken_job = _job(session, age_s=1)
        retaken = Shard(job_id=retaken_job.id, phase=0, index=0, kind="strip", status="pending", payload={})
        session.add(retaken)
        session.flush()
        ids["retaken"] = retaken.id
    alive = frozenset({"gpu0@h", "coordinator@h"})
    plain = Held(alive, frozenset(), frozenset())
    handed_back = Held(alive, frozenset({ids["retaken"]}), frozenset(), frozenset(),
                       frozenset({ids["shared"], ids["pinned"], ids["retaken"]}))
    with session_scope() as session:
        waits = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                          held=lambda: plain, grace_s=6, gpu_backlog=12)
        assert waits.shards == []  # a batch keeps the shared queue busy; the pinned one is a second old
        repairs = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                            held=lambda: handed_back, grace_s=6, gpu_backlog=12)
        assert sorted(t.shard_id for t in repairs.shards) == sorted([ids["shared"], ids["pinned"]])
        assert all(t.job_id for t in repairs.shards)
        # the supervisor's hand-back is forgotten once judged (workers.tasks.reconcile_once): not sent twice
        again = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                          held=lambda: plain, grace_s=6, gpu_backlog=12)
        assert again.shards == []


def test_pending_shards_no_message_will_deliver_are_sent_again(db: str) -> None:
    """A coordinator killed (or refused by a restarting broker) between committing a phase and sending its shards
    leaves them pending with no message: sent at once when its lease was handed back, else once the shared GPU
    queue is empty a grace after the phase was planned; once each, and never while the queue still holds work."""
    from services.jobs.reconcile import Held

    with session_scope() as session:
        dropped = _job(session)
        quiet = _job(session)
        ids = {}
        for name, job in (("dropped", dropped), ("quiet", quiet)):
            shard = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="pending", payload={})
            session.add(shard)
            session.flush()
            ids[name], ids[name + "_job"] = shard.id, job.id
        session.execute(update(Job).where(Job.id == dropped.id).values(updated_at=utcnow()))  # planned just now
    alive = frozenset({"gpu0@h"})
    leases = Held(alive, frozenset(), frozenset(), frozenset({ids["dropped_job"]}))
    with session_scope() as session:
        busy = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                         held=lambda: leases, grace_s=6, gpu_backlog=5)
        assert [t.shard_id for t in busy.shards] == [ids["dropped"]]  # the queue's work may include "quiet"'s
        idle = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                         held=lambda: Held(alive, frozenset(), frozenset()), grace_s=6, gpu_backlog=0)
        assert [t.shard_id for t in idle.shards] == [ids["quiet"]]  # "dropped" was planned a moment ago
        again = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                          held=lambda: Held(alive, frozenset(), frozenset()), grace_s=6, gpu_backlog=0)
        assert again.shards == []  # sent once: the touch makes the next pass wait another grace


def test_a_shard_waiting_for_its_retry_is_not_sent_again(db: str) -> None:
    """Found from outside: a shard whose attempt failed (an object store away) waited for its retry message in a
    worker, the reconciler found it pending with the queue empty and sent a second message: two tasks then ran it
    in turn. A shard whose retry is due later (flow.note_retry) is on its way, not lost."""
    from services.jobs.reconcile import Held

    with session_scope() as session:
        job = _job(session)
        shard = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="running", payload={}, attempts=1,
                      started_at=utcnow() - dt.timedelta(seconds=60))
        session.add(shard)
        session.flush()
        shard_id = shard.id
    with session_scope() as session:
        flow.note_retry(session, shard_id, 30)
    alive = frozenset({"gpu0@h"})

    def idle() -> Held:
        return Held(alive, frozenset(), frozenset())

    with session_scope() as session:
        assert session.get(Shard, shard_id).status == "pending"
        waiting = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                            held=idle, grace_s=6, gpu_backlog=0)
        assert waiting.shards == []
        session.get(Shard, shard_id).payload = {"retry_at": 0}  # its retry was due long ago: lost after all
        session.commit()
        late = reconcile(session, alive_workers=set(alive), coordinator_backlog=0, stale_after_s=30,
                         held=idle, grace_s=6, gpu_backlog=0)
        assert [t.shard_id for t in late.shards] == [shard_id]


def test_a_shard_that_fails_after_its_job_ended_is_abandoned_not_retried(db: str) -> None:
    """Found from outside: a job cancelled while its shard computed logged an ERROR with a FileNotFoundError
    traceback (its intermediates removed under it) and retried the shard."""
    from services.storage import get_storage

    with session_scope() as session:
        job = _job(session)
        shard = Shard(job_id=job.id, phase=0, index=0, kind="strip", status="running")
        session.add(shard)
        session.flush()
        shard_id, job_id = shard.id, job.id
    with session_scope() as session:
        assert not flow.shard_abandoned(session, get_storage(), shard_id)  # a real failure: retried, reported
    for status, phase in (("cancelled", 0), ("running", 1)):
        with session_scope() as session:
            session.get(Job, job_id).status, session.get(Job, job_id).phase = status, phase
        with session_scope() as session:
            assert flow.shard_abandoned(session, get_storage(), shard_id)
    with session_scope() as session:
        assert flow.shard_abandoned(session, get_storage(), shard_id + 1000)  # rows gone: the job started over


def test_an_ended_jobs_unfinished_shards_are_marked_cancelled(db: str) -> None:
    """Found in review: a cancelled job's shards said `pending` / `running` for ever in GET /v1/jobs/{id}; so did
    the rest of a job failed by one shard's last attempt."""
    from services.jobs.service import cancel_job
    from services.storage import get_storage

    ids: dict[str, list[int]] = {}
    for ending in ("cancel", "fail"):
        with session_scope() as session:
            job = _job(session)
            shards = [Shard(job_id=job.id, phase=0, index=i, kind="strip", status=s)
                      for i, s in enumerate(("done", "running", "pending", "pending"))]
            session.add_all(shards)
            session.flush()
            ids[ending] = [job.id, *(s.id for s in shards)]
            station_id = job.station_id
        with session_scope() as session:
            if ending == "cancel":
                cancel_job(session, get_storage(), session.get(Station, station_id), ids[ending][0])
            else:
                flow.record_shard_failure(session, ids[ending][2], "boom", final=True, storage=get_storage())
    with session_scope() as session:
        assert [session.get(Shard, i).status for i in ids["cancel"][1:]] == ["done", "cancelled", "cancelled",
                                                                            "cancelled"]
        assert [session.get(Shard, i).status for i in ids["fail"][1:]] == ["done", "failed", "cancelled",
                                                                          "cancelled"]
        assert session.get(Job, ids["fail"][0]).status == "failed"


def test_advance_waits_for_the_whole_phase_and_moves_once(db: str) -> None:
    with session_scope() as session:
        job = _job(session)
        job.params = {**job.params, "plan": [{"kind": "frame_group"}, {"kind": "strip", "source": "x"}]}
        session.add(Shard(job_id=job.id, phase=0, index=0, kind="frame_group", status="done"))
        session.add(Shard(job_id=job.id, phase=0, index=1, kind="frame_group", status="running"))
        job_id = job.id
    from services.config import get_settings
    from services.storage import get_storage

    with session_scope() as session:
        assert flow.advance_job(session, get_storage(), get_settings(), job_id) == []
        assert session.get(Job, job_id).phase == 0


def test_pixel_shift_stack_runs_through_the_flow(db: str, tmp_path: Path) -> None:
    """A 4-shot pixel-shift stack through ingest, frame groups on two "workers", strips and finalize: the plan
    records the pattern, strips fuse every group, and the TIFF equals the whole fused render."""
    import io

    import numpy as np
    import tifffile

    from lab.synth.stack_synth import synthesize_stack
    from services.config import get_settings
    from services.pipeline.render import RenderParams
    from services.pipeline.stack import fuse_groups, merge_frame_group, render_rgb, stack_noise_factors
    from services.raw.decode import decode_raw
    from services.storage import get_storage

    shot = synthesize_stack(tmp_path / "ps", frames=4, scale=0.04, seed=9, pixel_shift=True)
    storage, settings = get_storage(), get_settings()
    job_id = _stack_job(shot.files, "ps-station")
    with session_scope() as session:
        tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=2)
        job = session.get(Job, job_id)
        assert job.params["plan"][0]["pixel_shift"] == [[0, 0], [0, 1], [1, 1], [1, 0]]
        assert len(tickets) == 2  # one frame group per worker
    for _ in range(2):  # frame groups, then strips
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
        with session_scope() as session:
            tickets = flow.advance_job(session, storage, settings, job_id)
            strips = [session.get(Shard, t.shard_id) for t in tickets]
            assert all(s.payload.get("groups") == 2 for s in strips)
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job.status == "done", job.error
        out = storage.local_path(job.outputs[0].storage_key).read_bytes()
        params = RenderParams.from_dict(job.params["render"])
    frames = []  # the intermediates are gone after finalize: merge again in one group
    for i, path in enumerate(shot.files):
        meta = decode_raw(path, tmp_path / f"raw_{i}.npy")
        frames.append((np.load(tmp_path / f"raw_{i}.npy"), meta))
    offsets = [(0, 0), (0, 1), (1, 1), (1, 0)]
    fused = fuse_groups([merge_frame_group(frames[0], frames, stack_size=4, positions=range(4), params=params,
                                              pixel_shift=offsets)])
    whole = render_rgb(fused, params, noise_factors=stack_noise_factors(True))
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(out)), whole)


def test_a_lost_intermediate_starts_the_job_over(db: str, tmp_path: Path) -> None:
    """Intermediates are not synced: a step that finds one gone (a host crash) rewinds the job to its uploads,
    which then runs to the end; past MAX_REWINDS the job fails with the reason."""

    import pytest

    from lab.synth.stack_synth import synthesize_stack
    from services.config import get_settings
    from services.storage import get_storage

    shot = synthesize_stack(tmp_path / "s", frames=3, scale=0.03, seed=4)
    storage, settings = get_storage(), get_settings()
    job_id = _stack_job(shot.files, "lost-station")

    def run_groups() -> list[ShardTicket]:
        with session_scope() as session:
            tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=2)
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
        with session_scope() as session:
            return flow.advance_job(session, storage, settings, job_id)

    strips = run_groups()
    storage.local_path(shard_key(job_id, 0, "frame_group", 1)).write_bytes(b"\x93NUMPY torn")  # a crash
    with pytest.raises(IntermediateLost) as lost, session_scope() as session:
        flow.run_shard(session, storage, strips[0].shard_id, worker="w@h", gpu="0", device="cpu")
    assert lost.value.job_id == job_id and "frame_group_001" in str(lost.value)
    with session_scope() as session:
        assert flow.rewind_job(session, storage, job_id, str(lost.value))
        job = session.get(Job, job_id)
        kept = {k: v for k, v in job.params.items() if k not in ("source_camera", "recipe_defs")}  # upload-time
        assert (job.status, job.phase, kept) == ("queued", -1, {"rewinds": 1})  # facts stay
        assert "source_camera" in job.params and "recipe_defs" in job.params
        assert session.query(Shard).filter(Shard.job_id == job_id).count() == 0
    for t in run_groups():  # the restart runs to the end
        with session_scope() as session:
            flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
    with session_scope() as session:
        flow.advance_job(session, storage, settings, job_id)
        job = session.get(Job, job_id)
        assert job.status == "done" and job.params["rewinds"] == 1, job.error
    with session_scope() as session:  # past the limit the job fails with the reason
        stuck = _job(session)
        stuck.params = {**stuck.params, "rewinds": flow.MAX_REWINDS}
        stuck_id = stuck.id
    with session_scope() as session:
        assert not flow.rewind_job(session, storage, stuck_id, "intermediate x lost")
        job = session.get(Job, stuck_id)
        assert job.status == "failed" and job.error == f"intermediate x lost (after {flow.MAX_REWINDS} restarts)"


def test_thumbnail_stacks_fail_at_ingest_with_the_reason(db: str, tmp_path: Path) -> None:

    import numpy as np

    from lab.bench.pipeline import CM, NEUTRAL
    from services.config import get_settings
    from services.raw.colour import CameraProfile
    from services.raw.dng import write_dng
    from services.storage import get_storage

    storage, settings = get_storage(), get_settings()
    paths = []
    for i in range(2):  # LibRaw refuses images under 22 px a side
        paths.append(tmp_path / f"tiny_{i}.dng")
        write_dng(paths[-1], np.full((12, 40), 9000 + i, np.uint16), cfa="RGGB", black_level=1024, white_level=65535,
                  profile=CameraProfile(CM), as_shot_neutral=NEUTRAL, make="Phase One", model="IQ2_XS")
    job_id = _stack_job(paths, "tiny-station")
    with session_scope() as session:
        assert flow.ingest_job(session, storage, settings, job_id, n_workers=2) == []
        job = session.get(Job, job_id)
        assert job.status == "failed"
        assert job.error.startswith("decode failed: LibRaw:") and "RAW" in job.error


def test_a_stack_frame_of_another_exposure_fails_at_ingest_with_the_reason(db: str, tmp_path: Path) -> None:
    """Found from outside: a stack whose frames were exposed differently (a bracket sent as a stack) was merged
    without a word. Its frames as the files state them must agree within a third of a stop."""
    import numpy as np

    from lab.bench.pipeline import CM, NEUTRAL
    from services.config import get_settings
    from services.raw.colour import CameraProfile
    from services.raw.dng import write_dng
    from services.raw.meta import CaptureInfo
    from services.storage import get_storage

    storage, settings = get_storage(), get_settings()
    rng = np.random.default_rng(0)
    exposures = [(1 / 125, 100), (1 / 125, 100), (1 / 30, 100), (1 / 250, 200)]  # the last: the same light
    paths = []
    for i, (t, iso) in enumerate(exposures):
        paths.append(tmp_path / f"bracket_{i}.dng")
        write_dng(paths[-1], rng.integers(4000, 20000, (64, 96), dtype=np.uint16), cfa="RGGB", black_level=1024,
                  white_level=65535, profile=CameraProfile(CM), as_shot_neutral=NEUTRAL, make="Phase One",
                  model="IQ2_XS", capture=CaptureInfo(exposure_time=t, f_number=8.0, iso=iso))
    failing = _stack_job(paths, "bracket-station")
    same_light = _stack_job([paths[0], paths[1], paths[3]], "iso-station")
    with session_scope() as session:
        assert flow.ingest_job(session, storage, settings, failing, n_workers=2) == []
        job = session.get(Job, failing)
        assert job.status == "failed"
        assert job.error == ("frame 2 was exposed +2.1 stops from frame 0 (1/30 s f/8 ISO 100 against 1/125 s f/8 "
                             "ISO 100): a stack's frames must share one exposure (exposure brackets are not merged; "
                             "render them as single frames)")
        assert flow.ingest_job(session, storage, settings, same_light, n_workers=2)
        assert session.get(Job, same_light).status == "running"


def test_a_frame_that_decodes_blank_fails_at_ingest(db: str, tmp_path: Path) -> None:
    """Found from outside: a DNG whose Compression tag says lossless JPEG over plain data decoded to all zeros,
    rendered black and was reported done (the API refuses that file now: test_raw_probe; this is the decode's
    own check, for any file that decodes to one value)."""
    import numpy as np

    from lab.bench.pipeline import CM, NEUTRAL
    from services.config import get_settings
    from services.raw.colour import CameraProfile
    from services.raw.dng import write_dng
    from services.storage import get_storage

    path = tmp_path / "badcomp.dng"
    write_dng(path, np.full((64, 96), 1024, np.uint16), cfa="RGGB", black_level=1024, white_level=65535,
              profile=CameraProfile(CM), as_shot_neutral=NEUTRAL, make="Phase One", model="IQ3_S")
    job_id = _stack_job([path], "blank-station", camera="IQ3_S")
    with session_scope() as session:
        assert flow.ingest_job(session, get_storage(), get_settings(), job_id, n_workers=2) == []
        job = session.get(Job, job_id)
        assert job.status == "failed" and job.error.startswith("decode failed: the decoded image is blank"), job.error
    from services.pipeline.prepare import check_not_blank

    night = np.full((400, 300), 1024, np.uint16)  # found from outside: a night scene lit in a few rows (and one
    night[258:270] = 30000                          # bright pixel) was refused as blank by a sample of rows
    check_not_blank(night, 0, 1)
    night[:] = 1024
    night[5, 7] = 65535
    check_not_blank(night, 0, 1)


def _run_to_the_end(job_id: str, n_workers: int = 2, quiet: QuietWindow | None = None) -> int:
    """Ingest, every phase's shards, advance until done; returns how many shards ran."""
    from services.config import get_settings
    from services.storage import get_storage

    storage, settings = get_storage(), get_settings()
    with session_scope() as session:
        tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=n_workers)
    ran = 0
    while tickets:
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu", quiet=quiet)
            ran += 1
        with session_scope() as session:
            tickets = flow.advance_job(session, storage, settings, job_id, quiet)
    return ran


@pytest.mark.one_backend
def test_several_recipes_come_from_one_render(db: str, synth_dir: Path) -> None:
    """tiff16 + jpeg-proof + tiff16-adobergb: one set of strip shards (as many as a one-recipe job), one output
    row per recipe; the sRGB TIFF is the single-space render (and the one-recipe job's file, byte for byte), the
    Adobe RGB one that space's; EXIF carried over."""
    import io

    import numpy as np
    import tifffile
    from PIL import Image

    from services.pipeline.render import render_mosaic
    from services.pipeline.shot import shot_render_params
    from services.raw.decode import decode_raw
    from services.storage import get_storage

    frame = synth_dir / "iq3s" / "frame_00.dng"
    single = _stack_job([frame], "one-recipe", camera="IQ3_S")
    multi = _stack_job([frame], "three-recipes", camera="IQ3_S", recipes=("tiff16", "jpeg-proof", "tiff16-adobergb"))
    assert _run_to_the_end(multi) == _run_to_the_end(single)
    storage = get_storage()
    with session_scope() as session:
        job = session.get(Job, multi)
        assert job.status == "done", job.error
        assert job.recipe == "tiff16" and job.recipes == ["tiff16", "jpeg-proof", "tiff16-adobergb"]
        outs = {o.recipe: (o.name, o.media_type, o.sha256, storage.local_path(o.storage_key).read_bytes())
                for o in job.outputs}
        one = session.get(Job, single).outputs[0]
        assert (one.name, one.recipe) == ("frame_00.tif", "tiff16")
        assert storage.local_path(one.storage_key).read_bytes() == outs["tiff16"][3]
    assert {r: o[:2] for r, o in outs.items()} == {
        "tiff16": ("frame_00.tif", "image/tiff"), "jpeg-proof": ("frame_00_jpeg-proof.jpg", "image/jpeg"),
        "tiff16-adobergb": ("frame_00_tiff16-adobergb.tif", "image/tiff")}
    meta = decode_raw(frame, synth_dir / "whole.npy")
    mosaic = np.load(synth_dir / "whole.npy")
    for recipe, space in (("tiff16", "srgb"), ("tiff16-adobergb", "adobergb")):
        whole = render_mosaic(mosaic, shot_render_params(meta, mosaic, space))
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(outs[recipe][3])), whole)
    with Image.open(io.BytesIO(outs["jpeg-proof"][3])) as im:
        assert max(im.size) == min(1600, max(mosaic.shape)) and im.getexif()[271] == "Phase One"


def test_a_stack_renders_several_spaces_in_its_strips(db: str, tmp_path: Path) -> None:
    from lab.synth.stack_synth import synthesize_stack

    shot = synthesize_stack(tmp_path / "s", frames=2, scale=0.03, seed=5)
    job_id = _stack_job(shot.files, "stack-spaces", recipes=("tiff16-prophoto", "tiff8", "png16"))
    _run_to_the_end(job_id)
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job.status == "done", job.error
        assert sorted(o.name for o in job.outputs) == ["frame_00_png16.png", "frame_00_tiff16-prophoto.tif",
                                                       "frame_00_tiff8.tif"]
        assert job.params["render"]["space"] == "prophoto"
        assert [s["space"] for s in job.params["render"]["extra_spaces"]] == ["srgb"]
        from api.schemas import RenderOut

        render = RenderOut.of(job.params["render"])  # what GET /v1/jobs/{id} says: a 2-frame stack, turned once
        assert render is not None and render.frames == 2 and render.orientations == 1
        # its two frames sample the scene in step on the CFA's diagonal (shifts -0.74, -1.28): the shot's package
        # renders them (stack.sampling_concentration), not the companion
        assert render.package == "strata_jdd_v2.strata" and render.frames_package == "strata_jdd_v2.strata"


def test_work_of_an_older_version_is_rerendered_not_failed(db: str, tmp_path: Path) -> None:
    """Upgrades without a drain: a stack planned by an older version (no ``plan_version``), or whose frame-group
    accumulator has the old 4-channel layout, meets the new code: the step raises IntermediateLost, the job starts
    over from its uploads and renders to the end with the new code (it never fails)."""
    import numpy as np
    import pytest

    from lab.synth.stack_synth import synthesize_stack
    from services.config import get_settings
    from services.jobs.plan import PLAN_VERSION
    from services.storage import get_storage

    shot = synthesize_stack(tmp_path / "s", frames=3, scale=0.03, seed=5)
    storage, settings = get_storage(), get_settings()
    job_id = _stack_job(shot.files, "upgrade-station")

    def run(tickets: list[ShardTicket]) -> None:
        for t in tickets:
            with session_scope() as session:
                flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")

    def ingest() -> list[ShardTicket]:
        with session_scope() as session:
            return flow.ingest_job(session, storage, settings, job_id, n_workers=2)

    def rewound_by(exc: IntermediateLost) -> None:
        with session_scope() as session:
            assert flow.rewind_job(session, storage, job_id, str(exc))
            assert session.get(Job, job_id).status == "queued"

    groups = ingest()
    run(groups)
    with session_scope() as session:
        strips = flow.advance_job(session, storage, settings, job_id)
        assert session.get(Job, job_id).params["plan_version"] == PLAN_VERSION
    key = shard_key(job_id, 0, "frame_group", 0)
    old = np.array(storage.load_array(key)[:4])  # the old 4-channel layout, as an older worker wrote it
    storage.local_path(key + ".sample").unlink(missing_ok=True)
    storage.save_array(key, old)
    with pytest.raises(IntermediateLost, match="unknown layout") as old_acc:
        run(strips[:1])
    rewound_by(old_acc.value)
    groups = ingest()
    with session_scope() as session:  # as an older coordinator planned it
        job = session.get(Job, job_id)
        job.params = {k: v for k, v in job.params.items() if k != "plan_version"}
    with pytest.raises(IntermediateLost, match="layout version 1") as old_plan:
        run(groups[:1])
    rewound_by(old_plan.value)
    run(ingest())
    with session_scope() as session:
        run(flow.advance_job(session, storage, settings, job_id))
    with session_scope() as session:
        flow.advance_job(session, storage, settings, job_id)
        job = session.get(Job, job_id)
        assert job.status == "done", job.error
        assert job.params["rewinds"] == 2 and job.params["plan_version"] == PLAN_VERSION


@pytest.mark.one_backend
def test_a_raw_merge_stack_runs_through_the_flow(db: str, tmp_path: Path) -> None:
    """STRATA_STACK_RAW_MERGE: the plan carries it (RenderParams.raw_merge), the frame groups write 11-channel
    accumulators and the strips render them to the end."""
    from lab.synth.stack_synth import synthesize_stack
    from services.config import get_settings
    from services.pipeline.shards import load_accumulator
    from services.storage import get_storage

    shot = synthesize_stack(tmp_path / "s", frames=3, scale=0.03, seed=4)
    storage, settings = get_storage(), get_settings().model_copy(update={"stack_raw_merge": True})
    job_id = _stack_job(shot.files, "raw-merge-station")
    with session_scope() as session:
        tickets = flow.ingest_job(session, storage, settings, job_id, n_workers=2)
        assert session.get(Job, job_id).params["render"]["raw_merge"] is True
    for t in tickets:
        with session_scope() as session:
            flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
    group = load_accumulator(storage, job_id, shard_key(job_id, 0, "frame_group", 1))
    assert group.shape[0] == 15  # 5, the detail band's 4, the raw merge's 6
    with session_scope() as session:
        strips = flow.advance_job(session, storage, settings, job_id)
    for t in strips:
        with session_scope() as session:
            flow.run_shard(session, storage, t.shard_id, worker="w@h", gpu="0", device="cpu")
    with session_scope() as session:
        flow.advance_job(session, storage, settings, job_id)
        job = session.get(Job, job_id)
        assert job.status == "done", job.error


def test_a_cancel_committed_while_ingest_starts_is_not_overwritten(db: str, synth_dir: Path) -> None:
    """The coordinator holds the job as it was loaded (queued); a cancel commits meanwhile. Ingest's move to
    running is conditional, so the job stays cancelled and nothing is planned."""
    from services.config import get_settings
    from services.storage import get_storage

    job_id = _stack_job([synth_dir / "iq3s" / "frame_00.dng"], "cancel-race", camera="IQ3_S")
    with session_scope() as coordinator:
        stale = flow.load_job(coordinator, job_id)
        assert stale.status == "queued"
        with session_scope() as api:
            api.execute(update(Job).where(Job.id == job_id).values(status="cancelled", stage="cancelled"))
            api.commit()
        assert flow.ingest_job(coordinator, get_storage(), get_settings(), job_id, n_workers=1) == []
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.phase) == ("cancelled", -1)


@pytest.mark.one_backend
def test_a_proof_finished_by_the_worker_of_a_whole_image_strip_is_the_writers_file(
        db: str, synth_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiff16 + a 200 px proof (binned by 2): with one worker the one strip holds the whole image and its worker
    finishes the proof (the plan's proof_specs, ProofWork); with two the writer finishes it from the strips' bins.
    On the CPU both give the same file, byte for byte."""
    from services.config import get_settings
    from services.jobs.plan import JobPlan
    from services.storage import get_storage

    recipes = tmp_path / "recipes.toml"
    recipes.write_text('[recipes.web]\nbase = "jpeg-proof"\nlong_edge = 200\n')
    monkeypatch.setattr(get_settings(), "recipes_file", recipes)
    from services.pipeline import shards

    finished: list[tuple[int, int]] = []
    real = shards.proof_from_bins
    monkeypatch.setattr(shards, "proof_from_bins", lambda *a: finished.append(a[1]) or real(*a))
    frame = synth_dir / "iq3s" / "frame_00.dng"
    jobs = {n: _stack_job([frame], f"proofs-{n}", camera="IQ3_S", recipes=("tiff16", "web")) for n in (1, 2)}
    assert _run_to_the_end(jobs[1], n_workers=1) == 1 and len(finished) == 1  # one strip: its worker finished it
    assert _run_to_the_end(jobs[2], n_workers=2) == 2 and len(finished) == 1  # two: the writer did
    storage = get_storage()
    proofs = {}
    with session_scope() as session:
        for n, job_id in jobs.items():
            job = session.get(Job, job_id)
            assert job.status == "done", job.error
            assert JobPlan.from_params(job.params).proof_specs  # asked of the whole-image strip's worker
            (proof,) = [o for o in job.outputs if o.recipe == "web"]
            proofs[n] = storage.local_path(proof.storage_key).read_bytes()
    assert proofs[1] == proofs[2]


class _Recorded(QuietWindow):
    """The real window (Redis) that also records what the finalize asked of it."""

    def __init__(self, url: str, max_wait_s: float) -> None:
        import redis

        super().__init__(redis.Redis.from_url(url), max_wait_s)
        self.events: list[tuple[str, object]] = []

    def open(self, job_id: str) -> None:
        self.events.append(("open", job_id))
        super().open(job_id)

    def close(self, job_id: str) -> None:
        self.events.append(("close", job_id))
        super().close(job_id)

    def waiter(self):  # type: ignore[no-untyped-def]
        pause = super().waiter()

        def recorded() -> float:
            waited = pause()
            self.events.append(("pause", waited))
            return waited

        return recorded


@pytest.mark.one_backend
def test_an_interactive_finalize_holds_the_disk_and_a_batch_lane_one_yields(
        db: str, synth_dir: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interactive job's outputs open the quiet window and close it once recorded (its own writes never wait);
    a batch-lane job's TIFF pauses between chunks and before its close, and while another job's mark is live it
    waits, within its budget, then finishes."""
    from services.jobs import quiet as quiet_module

    monkeypatch.setattr(quiet_module, "HOLD_S", 600.0)  # the batch job's render may outlast a mark on a busy host
    frame = synth_dir / "iq3s" / "frame_00.dng"
    quiet = _Recorded(redis_url, max_wait_s=0.3)
    quiet.client.delete(KEY)
    interactive = _stack_job([frame], "quiet-interactive", camera="IQ3_S")
    _run_to_the_end(interactive, quiet=quiet)
    assert quiet.events == [("open", interactive), ("close", interactive)]
    assert quiet.client.zcard(KEY) == 0
    quiet.events.clear()
    batch = _stack_job([frame], "quiet-batch", camera="IQ3_S", priority="batch")
    quiet.open("someone-elses-interactive-shot")
    _run_to_the_end(batch, quiet=quiet)
    pauses = [w for kind, w in quiet.events if kind == "pause"]
    assert len(pauses) >= 2 and sum(pauses) >= 0.3  # held for the whole budget, then written
    quiet.close("someone-elses-interactive-shot")
    with session_scope() as session:
        assert session.get(Job, batch).status == "done"
        assert session.get(Job, interactive).status == "done"


def test_a_stalled_advance_is_sent_again_once_while_leases_cannot_be_read(db: str) -> None:
    """Found from outside: for the seconds after Redis came back empty no lease could be read (``held`` None), and
    every pass of every coordinator re-sent the advance of a job whose phase had ended long before: it was
    finalized nine times. One re-send, then another only a cutoff later."""
    old = utcnow() - dt.timedelta(seconds=600)
    with session_scope() as session:
        stalled = _job(session)
        session.add(Shard(job_id=stalled.id, phase=0, index=0, kind="strip", status="done", finished_at=old))
        session.execute(update(Job).where(Job.id == stalled.id).values(updated_at=old))
        job_id = stalled.id
    with session_scope() as session:
        first = reconcile(session, alive_workers={"gpu0@h"}, coordinator_backlog=0, stale_after_s=30,
                          held=lambda: None)
        again = reconcile(session, alive_workers={"gpu0@h"}, coordinator_backlog=0, stale_after_s=30,
                          held=lambda: None)
    assert first.advance == [(job_id, "batch")] and again.advance == []


def test_a_stack_clipped_flat_in_its_shift_window_is_ingested(db: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Found from outside: a stack whose frames' central square (where the global shifts are measured) is a blown-out
    backdrop clipped at the white level failed at ingest with "torch.linalg.solve: ... the input matrix is
    singular"; such a frame's shift is not measurable, (0, 0) as for identical frames, and the stack is planned."""
    import numpy as np

    from lab.bench.pipeline import write_frame
    from services.config import get_settings
    from services.pipeline import stack as stack_module
    from services.storage import get_storage

    monkeypatch.setattr(stack_module, "SHIFT_WINDOW", 64)  # smaller than the frames: a crop, as on a 50 MP frame
    texture = np.random.default_rng(3).integers(2000, 40000, (112, 140)).astype(np.uint16)
    paths = []
    for i in range(3):
        frame = texture[i : i + 96, 4 : 4 + 128].copy()
        frame[8:88, 24:104] = 65535  # the central 64 x 64 square and more: clipped flat
        paths.append(tmp_path / f"frame_{i}.dng")
        write_frame(paths[-1], frame, "IQ2_XS")
    job_id = _stack_job(paths, "clipped-station")
    with session_scope() as session:
        assert flow.ingest_job(session, get_storage(), get_settings(), job_id, n_workers=2) != []
        job = session.get(Job, job_id)
        assert job.status != "failed", job.error
        assert job.params["render"]["shifts"] == [[0.0, 0.0]] * 3


@pytest.mark.one_backend
def test_a_tiff_the_worker_of_a_whole_image_strip_writes_itself_is_the_writers_file(
        db: str, synth_dir: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With GPU tiles (nvCOMP stood in for by the CPU container) and one worker, the one strip holds the whole
    image and its worker writes the TIFF itself (the plan's file_specs), durably, holding an interactive shot's
    quiet window; the finalize moves it into the outputs. With two workers (two strips), or the setting off, the
    coordinator writes it from the stored tiles: the same file, byte for byte, and the recorded SHA-256 is the
    file's."""
    import hashlib

    import torch

    from services.config import get_settings
    from services.jobs.plan import JobPlan
    from services.pipeline import shards, tiles
    from services.storage import get_storage
    from services.storage.keys import worker_file_keys

    def cpu_tiles(rows, y0, height, device, level=0):  # type: ignore[no-untyped-def]
        blob, index = tiles.cpu_tile_streams(rows.cpu().numpy(), y0, height)
        return torch.from_numpy(blob.copy()), index

    monkeypatch.setattr(shards.tiles, "gpu_available", lambda device: True)
    monkeypatch.setattr(shards.tiles, "device_tile_streams", cpu_tiles)
    written: list[str] = []
    real = shards._write_whole
    monkeypatch.setattr(shards, "_write_whole", lambda storage, whole, *a: real(storage, whole, *a)
                        and not written.append(whole.out))
    quiet = _Recorded(redis_url, max_wait_s=0.3)
    quiet.client.delete(KEY)
    frame = synth_dir / "iq3s" / "frame_00.dng"
    storage = get_storage()

    def run(name: str, n_workers: int) -> tuple[bytes, str, JobPlan]:
        job_id = _stack_job([frame], f"worker-tiff-{name}", camera="IQ3_S")
        tickets = 0
        with session_scope() as session:
            tickets = len(flow.ingest_job(session, storage, get_settings(), job_id, n_workers=n_workers))
        assert tickets == n_workers
        _run_to_the_end(job_id, n_workers=n_workers, quiet=quiet)
        with session_scope() as session:
            job = session.get(Job, job_id)
            assert job.status == "done", job.error
            (out,) = job.outputs
            data = storage.local_path(out.storage_key).read_bytes()
            assert (hashlib.sha256(data).hexdigest(), len(data)) == (out.sha256, out.bytes)
            return data, job_id, JobPlan.from_params(job.params)

    whole, job_id, plan = run("one", 1)
    assert plan.file_specs and len(written) == 1  # the worker wrote it
    assert quiet.events == [("open", job_id), ("close", job_id)] * 2  # its write, then the finalize
    assert not storage.exists(worker_file_keys(shard_key(job_id, 0, "strip", 0))[0])  # moved, not copied
    split, _, _ = run("two", 2)
    assert len(written) == 1 and split == whole  # two strips: the coordinator wrote it from their tiles
    monkeypatch.setattr(get_settings(), "worker_tiffs", False)
    off, _, plan = run("off", 1)
    assert not plan.file_specs and len(written) == 1 and off == whole
