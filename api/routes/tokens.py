"""Tokens over the API, for admins: list, create (station or admin), revoke."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from api.deps import SessionDep, StationDep
from api.schemas import ErrorOut, TokenCreate, TokenCreated, TokenOut
from services import stations
from services.stations import utc_text

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
ERRORS: dict[int | str, dict] = {code: {"model": ErrorOut} for code in (401, 403, 404, 409, 422)}


@router.get("", response_model=list[TokenOut], responses=ERRORS, summary="Every principal (admins only)")
def list_tokens(session: SessionDep, principal: StationDep) -> list[TokenOut]:
    stations.ensure_admin(principal)
    return [TokenOut(name=t.name, role=t.role, created_at=t.created_at, revoked=t.revoked)
            for t in stations.list_tokens(session)]


@router.post("", status_code=201, response_model=TokenCreated, responses=ERRORS,
             summary="Create a station or admin token (admins only); the token is shown once")
def create_token(body: TokenCreate, session: SessionDep, principal: StationDep) -> TokenCreated:
    stations.ensure_admin(principal)
    token = stations.create_station_token(session, body.name, replace=body.rotate,
                                          role="admin" if body.admin else "station")
    info = next(t for t in stations.list_tokens(session) if t.name == body.name.strip())
    return TokenCreated(name=info.name, role=info.role, created_at=info.created_at, revoked=False, token=token)


@router.delete("/{name}", status_code=204, response_class=Response, responses=ERRORS,
               summary="Revoke a token (admins only): it is refused from now on; its jobs stay")
def revoke_token(name: str, session: SessionDep, principal: StationDep) -> Response:
    stations.ensure_admin(principal)
    stations.revoke_token(session, name)
    return Response(status_code=204)


me_router = APIRouter(prefix="/v1", tags=["tokens"])


@me_router.get("/me", response_model=TokenOut, responses=ERRORS, summary="Who this token is (name and role)")
def who_am_i(principal: StationDep) -> TokenOut:
    return TokenOut(name=principal.name, role=principal.role, created_at=utc_text(principal.created_at),
                    revoked=False)
