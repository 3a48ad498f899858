"""Two processes of one worker name (a copied STRATA_NODE_NAME) and a shard delivered twice (hosts with different
STRATA_VISIBILITY_TIMEOUT_S): found from outside on two simulated hosts, where a shard rendered on both at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, replace

import redis

from workers import runtime
from workers.registry import PREFIX, Heartbeat, WorkerInfo, name_taken, pid_space


def _info(name: str, **kw: object) -> WorkerInfo:
    return replace(WorkerInfo(name=name, kind="gpu", gpu="cpu", device="cpu", queue=f"gpu.{name}", host="h", pid=1,
                              instance=uuid.uuid4().hex, machine=socket.gethostname(), pid_space=pid_space(),
                              beat_at=time.time()), **kw)


def test_a_name_another_live_process_holds_is_refused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    name = f"gpu0@dup-{uuid.uuid4().hex[:6]}"
    me = _info(name)
    assert name_taken(client, me) is None  # nobody
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for other, taken in ((_info(name, machine="another-host", pid=4242), True),  # another machine: live by its key
                         (_info(name, pid=int(dead)), False),  # this machine, its process gone: a restart
                         # one hostname, another PID namespace (a container of that hostname on another host)
                         (_info(name, pid=int(dead), pid_space="another-boot/pid:[1]"), True),
                         (_info(name, pid=os.getpid()), True),  # this machine, running
                         (replace(me, beat_at=time.time()), False)):  # my own key
        client.set(PREFIX + name, json.dumps(asdict(other)), ex=30)
        said = name_taken(client, me)
        assert (said is not None) == taken, (other, said)
        if taken:
            assert f"another process already runs as {name}" in said and "STRATA_NODE_NAME" in said
    client.delete(PREFIX + name)


def test_a_shard_another_live_worker_computes_is_held_elsewhere(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    other = _info(f"gpu1@other-{uuid.uuid4().hex[:6]}", shards=(9_000_001,))
    client.set(PREFIX + other.name, json.dumps(asdict(other)), ex=30)
    mine = Heartbeat(redis_url, _info(f"gpu0@me-{uuid.uuid4().hex[:6]}"), interval=60)
    saved = runtime._heartbeat
    runtime._heartbeat = mine
    try:
        assert runtime.held_elsewhere(9_000_001) == other.name
        assert runtime.held_elsewhere(9_000_002) is None
        mine.shards.add(9_000_002)  # one of this process's threads computes it
        assert runtime.held_elsewhere(9_000_002) == mine.info.name
    finally:
        runtime._heartbeat = saved
        client.delete(PREFIX + other.name)
