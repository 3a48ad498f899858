"""The dashboard: server-rendered HTML shells (Jinja2, autoescaped) whose data the page's script fetches from the
v1 API with the token the person pasted (kept in sessionStorage, sent as the Bearer header)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescape on for .html
STATIC_DIR = HERE / "static"

router = APIRouter(include_in_schema=False)


# The page runs only its own script and styles, shows previews from blob: URLs, talks only to this API and is
# never framed: a string that got past textContent could still not load or send anything elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; script-src 'self'; "
                               "style-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@router.get("/", response_class=HTMLResponse)
@router.get("/dashboard", response_class=HTMLResponse)
def dashboard(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "jobs.html", {"page": "jobs"}, headers=PAGE_HEADERS)


@router.get("/dashboard/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> HTMLResponse:
    return templates.TemplateResponse(request, "job.html", {"page": "job", "job_id": job_id}, headers=PAGE_HEADERS)
