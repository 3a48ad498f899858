"""Camera profiles: how a shot of each back is split across GPUs."""

from __future__ import annotations

from dataclasses import dataclass

from services.errors import BadInput, UnknownCamera


@dataclass(frozen=True)
class CameraProfile:
    name: str
    split_strategy: str  # "strip" (cut one frame into row strips) or "frame_group" (never cut a frame)
    min_frames: int
    max_frames: int


PROFILES: dict[str, CameraProfile] = {
    "IQ3_S": CameraProfile("IQ3_S", "strip", 1, 1),
    "IQ2_XS": CameraProfile("IQ2_XS", "frame_group", 2, 16),
}


def resolve_camera(requested: str | None, models: list[str], n_frames: int) -> CameraProfile:
    """The profile for a shot: the requested one, else detected from the model name, else from the frame count.

    Files from other backs are accepted: one frame renders as a single frame (strips), several as a stack. So does
    a shot whose detected back does not fit its frame count (one frame of an IQ2_XS back renders as a single frame,
    several of an IQ3_S back as a stack): the model name says which back, the count what was shot. Only a requested
    camera that does not fit the count is refused.
    """
    if requested:
        profile = PROFILES.get(requested.strip().upper())
        if profile is None:
            raise UnknownCamera(f"unknown camera {requested!r}; expected one of {', '.join(PROFILES)}")
    else:
        detected = {name for name in PROFILES for model in models if name.replace("_", "").lower()
                    in model.replace("_", "").replace(" ", "").lower()}
        fitting = {name for name in detected
                   if PROFILES[name].min_frames <= n_frames <= PROFILES[name].max_frames}
        if len(fitting) == 1:
            profile = PROFILES[fitting.pop()]
        else:
            profile = PROFILES["IQ3_S" if n_frames == 1 else "IQ2_XS"]
    if not profile.min_frames <= n_frames <= profile.max_frames:
        want = (str(profile.min_frames) if profile.min_frames == profile.max_frames
                else f"{profile.min_frames}-{profile.max_frames}")
        raise BadInput(f"camera {profile.name} takes {want} frame(s), got {n_frames}")
    return profile
