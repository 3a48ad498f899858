"""Logging set-up: plain text, or one JSON object a line (STRATA_LOG_FORMAT=json) with job and shard ids when a
message names them (``job <id>``, ``shard <id>``)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re

_JOB = re.compile(r"\bjob ([0-9a-f]{32})\b")
_SHARD = re.compile(r"\bshard (\d+(?:/\d+/\d+)?|[0-9a-f]{32}/\d+/\d+)\b")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
        out: dict[str, object] = {"ts": ts.replace("+00:00", "Z"), "level": record.levelname,
                                  "logger": record.name, "message": message}
        job = getattr(record, "job_id", None) or (m.group(1) if (m := _JOB.search(message)) else None)
        shard = getattr(record, "shard_id", None) or (m.group(1) if (m := _SHARD.search(message)) else None)
        if job:
            out["job_id"] = job
        if shard:
            out["shard_id"] = shard
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # seven "setup plugin" lines a start
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # the server's own lines (its start, requests, an
        own = logging.getLogger(name)  # unhandled error's traceback) in this format too: one JSON object a line
        own.handlers[:] = []
        own.propagate = True
