"""What a job's ending does to its shards."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from services.db.models import Shard, utcnow
from services.jobs.states import ShardStatus


def end_unfinished_shards(session: Session, job_id: str) -> None:
    """Mark the shards of an ended job (cancelled or failed) that had not finished ``cancelled``: none will run
    (workers skip the shards of an ended job) and one computing now has its result ignored. Not committed."""
    session.execute(update(Shard).where(Shard.job_id == job_id,
                                        Shard.status.in_((ShardStatus.PENDING, ShardStatus.RUNNING)))
                    .values(status=ShardStatus.CANCELLED, finished_at=utcnow()))


__all__ = ["end_unfinished_shards"]
