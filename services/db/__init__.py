from services.db.models import Base, Frame, Job, Output, Shard, Station
from services.db.session import get_engine, get_session, reset_engine, session_scope

__all__ = ["Base", "Frame", "Job", "Output", "Shard", "Station", "get_engine", "get_session", "reset_engine",
           "session_scope"]
