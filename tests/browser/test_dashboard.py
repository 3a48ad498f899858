"""The dashboard as a person uses it: a real headless Chromium (Debian's, driven by Selenium through Debian's
chromedriver; nothing downloads a browser) against the real service: uvicorn API, Redis, a coordinator and a
CPU worker as processes, synthetic DNGs. Screenshots go to test-output/browser/ (CI keeps them)."""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select

from tests.conftest import backend_url, configure, reset_database

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver); .ci/run "
           "installs them")]
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
XSS_NAME = "<img src=x onerror=alert(1)>.dng"
LONG_NAME = "catalogue_autumn_" + "very_long_client_reference_" * 8 + "shot_0042.raf"
# Counts the page's API calls (url, Authorization, status): a page reload drops it.
RECORD_FETCH = """
window.calls = [];
const original = window.fetch;
window.fetch = async (url, opts) => {
  const call = {url: String(url), auth: opts && opts.headers && opts.headers.Authorization, status: null,
                signedOut: window.signedOut === true};  // made after the sign-out click (MARK_SIGN_OUT)
  window.calls.push(call);
  const r = await original(url, opts);
  call.status = r.status;
  return r;
};"""
# Marks the moment of the sign-out click: a listener on the document's capture phase runs before the button's own.
MARK_SIGN_OUT = """
window.signedOut = false;
document.addEventListener("click", (e) => { if (e.target.id === "signout") window.signedOut = true; }, true);"""


@dataclass
class Service:
    url: str
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Service]:
    import redis

    from services.db.session import session_scope
    from services.stations import create_station_token
    from workers.launcher import ProcSpec, Supervisor, free_port, worker_specs

    root = tmp_path_factory.mktemp("browser")
    url = backend_url("sqlite", root)
    base, _, number = redis_url.rpartition("/")
    own_redis = f"{base}/{int(number or 0) + 2}"  # e2e uses the next database; this one the one after
    redis.Redis.from_url(own_redis).flushdb()
    env = {"STRATA_DATABASE_URL": url, "STRATA_DATA_DIR": str(root / "var"), "STRATA_REDIS_URL": own_redis,
           "STRATA_CPU_WORKERS": "1", "STRATA_TORCH_THREADS": "1", "STRATA_FAULT_SHARD_DELAY_S": "0.5",
           "STRATA_WORKER_HEARTBEAT_S": "1", "STRATA_MIGRATE_ON_START": "false", "PYTHONUNBUFFERED": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(root / "metrics")}
    configure(url, root / "var")
    reset_database(url)
    with session_scope() as session:
        tokens = {"a": create_station_token(session, "studio-a"), "b": create_station_token(session, "studio-b"),
                  "admin": create_station_token(session, "manager", role="admin")}
    os.makedirs(env["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)
    from services.config import Settings

    port = free_port()
    specs = [ProcSpec("api", [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--host",
                              "127.0.0.1", "--port", str(port), "--log-level", "warning"])]
    specs += worker_specs(Settings(cpu_workers=1, coordinators=1, express_coordinators=0))  # one coordinator
    sup = Supervisor(specs, env=env, log_dir=root / "logs")
    sup.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, root)
        yield Service(base_url, tokens)
    finally:
        sup.stop()


def _wait_ready(url: str, root: Path) -> None:
    ready: dict = {}
    for _ in range(240):
        try:
            r = httpx.get(f"{url}/readyz", timeout=2)
            ready = r.json()
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-2000:] for p in (root / "logs").glob("*.log"))
    pytest.fail(f"service did not become ready: {ready}\n{logs}")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="strata-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1366,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})
    driver = webdriver.Chrome(service=DriverService(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def small_frame(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small IQ3_S frame (scale 0.05, a quarter of synth_dir's pixels) for the jobs whose render is only waited
    for: what the page shows of them does not depend on the frame's size, and they render sooner."""
    from lab.synth.synth import synthesize_shot

    return synthesize_shot("IQ3_S", tmp_path_factory.mktemp("small"), scale=0.05, seed=1, noise=0.0005).files[0]


def _submit(service: Service, who: str, path: Path, name: str) -> str:
    r = httpx.post(f"{service.url}/v1/jobs", headers={"Authorization": f"Bearer {service.tokens[who]}"},
                   files=[("frames", (name, path.read_bytes()))], timeout=60)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _until(check: Callable[[], object], timeout: float = 90, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - the page is still changing
            value = None
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _sign_in(driver: WebDriver, url: str, token: str, path: str = "/") -> None:
    d = driver
    d.get(url + "/")
    d.execute_script("sessionStorage.clear()")
    d.get(url + path)
    _type_token(d, token)


def _type_token(d: WebDriver, token: str) -> None:
    field = _until(lambda: d.find_element(By.ID, "token").is_displayed() and d.find_element(By.ID, "token"), 20,
                   "the sign-in form")
    field.send_keys(token)  # type: ignore[union-attr]
    d.find_element(By.CSS_SELECTOR, "#signin-form button").click()


def _calls(driver: WebDriver, part: str) -> list[dict]:
    return [c for c in driver.execute_script("return window.calls") if part in c["url"]]


def _broken_raw() -> bytes:
    """A RAF the upload probe accepts (it reads only the signature) and LibRaw cannot decode: fails at ingest."""
    import numpy as np

    noise = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    return b"FUJIFILMCCD-RAW 0201FF383501" + b"X-T5".ljust(32, b"\0") + noise


def _row_status(driver: WebDriver, job_id: str) -> str | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]')
    return rows[0].get_attribute("data-status") if rows else None


def _shot(driver: WebDriver, name: str) -> None:
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def _no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert.dismiss()
    except NoAlertPresentException:
        return True
    return False


def test_a_wrong_token_shows_a_clear_message(service: Service, browser: WebDriver) -> None:
    _sign_in(browser, service.url, "strata_not-a-real-token")
    message = _until(lambda: browser.find_element(By.ID, "signin-error").text, 20, "the sign-in error")
    assert "not accepted" in str(message)
    assert browser.find_element(By.ID, "signin").is_displayed()
    assert not browser.find_element(By.ID, "app").is_displayed()
    _shot(browser, "01-wrong-token")


def test_a_station_watches_its_job_from_queued_to_done(service: Service, browser: WebDriver,
                                                      synth_dir: Path, small_frame: Path) -> None:
    frame = synth_dir / "iq3s" / "frame_00.dng"  # full size: the window to see the job queued or running
    other = _submit(service, "b", frame, "studio_b_shot.dng")
    _sign_in(browser, service.url, service.tokens["a"])
    _until(lambda: "studio-a" in browser.find_element(By.ID, "who").text, 20, "the signed-in banner")
    job = _submit(service, "a", frame, "portrait_001.dng")
    xss = _submit(service, "a", small_frame, XSS_NAME)  # only listed: its render is not waited for
    seen: list[str] = []
    focused: list = []

    def done() -> bool:
        if not focused and _row_status(browser, job):  # a keyboard user on the running job's link
            focused.append(browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job}"] a.shot'))
            browser.execute_script("arguments[0].focus()", focused[0])
        status = _row_status(browser, job)
        if status and (not seen or seen[-1] != status):
            seen.append(status)
        return status == "done"

    _until(done, 180, "the job to be done in the list")
    assert seen[0] in ("queued", "running") and seen[-1] == "done", seen
    # Rows are updated in place: the link focused while the job ran keeps the focus through every poll.
    assert browser.execute_script("return document.activeElement === arguments[0]", focused[0])
    assert "Updated" not in browser.find_element(By.ID, "jobs-status").text  # the aria-live line: counts only
    thumb = _until(lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job}"] td.thumb img')
                   .get_attribute("src").startswith("blob:") and browser.find_element(
                       By.CSS_SELECTOR, f'tr[data-job-id="{job}"] td.thumb img'), 30, "the preview thumbnail")
    assert browser.execute_script("return arguments[0].naturalWidth", thumb) > 0
    assert _row_status(browser, other) is None  # another station's job is not shown
    assert not browser.find_element(By.ID, "f-station-wrap").is_displayed()  # the station filter is for admins
    assert "studio-b" not in browser.find_element(By.ID, "jobs").text
    # The hostile file name is text: the link shows it, no element was made from it, no alert fired.
    link = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{xss}"] a.shot')
    assert link.text == XSS_NAME
    assert browser.find_elements(By.CSS_SELECTOR, 'img[src="x"]') == []
    assert _no_alert(browser)
    _shot(browser, "02-station-jobs")
    assert not [e for e in browser.get_log("browser") if "favicon" in e["message"]]
    browser.set_window_size(820, 1180)  # a tablet
    _shot(browser, "03-station-jobs-tablet")
    browser.set_window_size(560, 900)  # narrower than promised: the tables scroll inside their panels
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.set_window_size(1366, 900)


def test_job_detail_shows_preview_timeline_and_downloads(service: Service, browser: WebDriver,
                                                          small_frame: Path) -> None:
    job = _submit(service, "a", small_frame, "detail_shot.dng")
    _sign_in(browser, service.url, service.tokens["a"])
    _until(lambda: _row_status(browser, job) == "done", 180, "the job to be done")
    browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job}"] a.shot').click()
    _until(lambda: browser.current_url.endswith(f"/dashboard/jobs/{job}"), 20, "the detail page")
    bars = _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#timeline svg rect.shard"), 30, "the timeline")
    assert len(bars) >= 1  # type: ignore[arg-type]
    lanes = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#timeline svg text.lane")]
    assert lanes and all("cpu" in lane for lane in lanes)
    _until(lambda: browser.find_element(By.ID, "job-preview").get_attribute("data-kind") == "final", 30,
           "the final preview")
    assert "Download detail_shot" in browser.find_element(By.ID, "downloads").text
    render = browser.find_element(By.ID, "render-info").text  # the job's render decision (package, noise)
    assert render.startswith("strata_jdd_v2") or render.startswith("classical_v1"), render
    assert "dB at 18 % grey" in render or "noise-free" in render, render
    assert browser.find_element(By.ID, "cancel").get_attribute("disabled") is not None
    _shot(browser, "04-job-detail")
    browser.execute_script("document.getElementById('timeline').scrollIntoView()")
    _shot(browser, "05-job-timeline")
    removed = httpx.delete(f"{service.url}/v1/jobs/{job}/files",
                           headers={"Authorization": f"Bearer {service.tokens['a']}"}, timeout=30)
    assert removed.status_code == 200, removed.text
    browser.find_element(By.CSS_SELECTOR, "#downloads button").click()  # the page still offers it: 410 Gone
    banner = _until(lambda: browser.find_element(By.ID, "banner").text, 20, "the download's error")
    assert "Download failed: " in str(banner) and "was removed" in str(banner), banner
    browser.refresh()  # the page stops polling once a job is done
    _until(lambda: "Files removed" in browser.find_element(By.ID, "downloads").text, 30, "the removal shown")
    assert "Download" not in browser.find_element(By.ID, "downloads").text
    assert "went with the files" in browser.find_element(By.ID, "preview-caption").text
    _shot(browser, "07-job-files-removed")


def test_batches_a_failed_shot_a_long_name_and_paging(service: Service, browser: WebDriver) -> None:
    auth = {"Authorization": f"Bearer {service.tokens['a']}"}
    night = httpx.post(f"{service.url}/v1/batches", json={"name": "Night run"}, headers=auth, timeout=30).json()
    later = httpx.post(f"{service.url}/v1/batches", headers=auth, timeout=30, json={
        "name": "Tomorrow's catalogue", "not_before": (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat(),
        "sealed": False})  # its shots still being uploaded
    assert later.status_code == 201 and later.json()["status"] == "scheduled", later.text
    r = httpx.post(f"{service.url}/v1/batches/{night['id']}/shots", files=[("frames", (LONG_NAME, _broken_raw()))],
                   headers=auth, timeout=60)
    assert r.status_code == 202, r.text
    failed = r.json()["id"]
    browser.set_window_size(1400, 900)
    _sign_in(browser, service.url, service.tokens["a"], "/dashboard?limit=2")  # two jobs a page
    _until(lambda: _row_status(browser, failed) == "failed", 90, "the shot to fail at decode")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{failed}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.batch").text == "Night run"  # the batch's name, not its id
    assert row.find_element(By.CSS_SELECTOR, "a.shot").get_attribute("title") == LONG_NAME
    # The long name is cut short: every column stays on screen, nothing scrolls sideways.
    assert browser.execute_script(
        "const w = document.querySelector('.table-wrap'); return w.scrollWidth <= w.clientWidth && "
        "document.querySelector('#jobs th:last-child').getBoundingClientRect().right <= window.innerWidth")
    # Batches: name, status, done/total, when a scheduled one starts, its report, Cancel while unfinished.
    items = {li.find_element(By.CSS_SELECTOR, ".batch-name").text: li
             for li in _until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#batches li")) == 2
                              and browser.find_elements(By.CSS_SELECTOR, "#batches li"), 20, "both batches")}
    _until(lambda: items["Night run"].text.startswith("Night run failed\n0/1 done · 1 failed"), 30,
           "the night run's status and counts")
    assert not items["Night run"].find_element(By.XPATH, ".//button[.='Cancel batch']").is_displayed()
    assert "scheduled · uploading" in items["Tomorrow's catalogue"].text
    assert "starts" in items["Tomorrow's catalogue"].text
    browser.execute_script(RECORD_FETCH)
    items["Night run"].find_element(By.XPATH, ".//button[.='Report (CSV)']").click()
    _until(lambda: [c["status"] for c in _calls(browser, "/report?format=csv")] == [200], 20, "the report")
    assert _calls(browser, "/report")[0]["auth"] == f"Bearer {service.tokens['a']}"
    _shot(browser, "08-batches-and-a-long-name")
    items["Tomorrow's catalogue"].find_element(By.XPATH, ".//button[.='Cancel batch']").click()
    _until(lambda: "cancelled" in items["Tomorrow's catalogue"].text, 20, "the batch cancelled")
    assert not items["Tomorrow's catalogue"].find_element(By.XPATH, ".//button[.='Cancel batch']").is_displayed()
    # Paging: the newest two, then older ones on request; the status filter runs on the server.
    assert "Showing the newest 2" in browser.find_element(By.ID, "jobs-status").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 2
    browser.find_element(By.ID, "older").click()
    _until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 4, 20, "older jobs")
    status = Select(browser.find_element(By.ID, "f-status"))
    status.select_by_visible_text("done")  # older than the failed one: a page of 2
    _until(lambda: {r.get_attribute("data-status") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")}
           == {"done"} and len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 2, 20, "done jobs")
    assert browser.find_element(By.ID, "older").is_displayed()
    status.select_by_visible_text("failed")
    _until(lambda: [r.get_attribute("data-job-id") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")]
           == [failed], 20, "the failed job alone")
    assert browser.find_element(By.ID, "jobs-status").text == "1 job(s)."
    # Its detail says it failed, and the long name wraps instead of pushing the page sideways.
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{failed}"] a.shot')
    row.click()
    _until(lambda: browser.find_element(By.ID, "preview-caption").text == "No preview: the job failed.", 20,
           "the failed job's detail")
    assert browser.find_element(By.ID, "downloads").text == "No outputs: the job failed."
    assert "No shard ran: the job failed." in browser.find_element(By.ID, "timeline").text
    assert "could not be read" in browser.find_element(By.ID, "job-error").text
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    _shot(browser, "09-failed-job-long-name")
    # The service away for a moment: the page retries with back-off and clears the banner when it answers.
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": [f"*/v1/jobs/{failed}"]})
    browser.refresh()
    _until(lambda: "Trying again" in browser.find_element(By.ID, "banner").text, 20, "the retry banner")
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    _until(lambda: not browser.find_element(By.ID, "banner").is_displayed(), 20, "the banner cleared")
    assert browser.find_element(By.ID, "job-summary").text.startswith("failed")
    # A job id nobody can see: no Cancel button.
    browser.get(f"{service.url}/dashboard/jobs/0123456789abcdef")
    _until(lambda: "does not exist" in browser.find_element(By.ID, "banner").text, 20, "the 404 banner")
    assert not browser.find_element(By.ID, "cancel").is_displayed()
    browser.set_window_size(1366, 900)


def test_new_jobs_on_an_open_page_keep_the_list_bounded(service: Service, browser: WebDriver) -> None:
    """A page left open while shots keep coming (a night's batch) holds about the pages it loaded, not every job
    that arrived (found from outside: 1,500 new jobs on an open page were 1,600 rows, each with its preview kept)."""
    from services.db.session import session_scope
    from services.stations import create_station_token

    with session_scope() as session:
        auth = {"Authorization": f"Bearer {create_station_token(session, 'studio-night')}"}

    def submit(i: int) -> str:
        r = httpx.post(f"{service.url}/v1/jobs", files=[("frames", (f"night_{i:02d}.raf", _broken_raw()))],
                       headers=auth, timeout=60)
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    first = submit(0)
    _sign_in(browser, service.url, auth["Authorization"].removeprefix("Bearer "), "/dashboard?limit=2")
    _until(lambda: _row_ids(browser) == [first], 30, "the one job")
    browser.execute_cdp_cmd("Network.enable", {})  # the seven arrive between two polls, as in a busy minute
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/v1/jobs/changes*"]})
    newest = [submit(i) for i in range(1, 8)][::-1]
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    # past a page more than it had, the list starts again from the newest page: two rows and older ones to load
    _until(lambda: _row_ids(browser) == newest[:2], 30, "the newest page again")
    assert "Showing the newest 2" in browser.find_element(By.ID, "jobs-status").text
    browser.find_element(By.ID, "older").click()
    _until(lambda: _row_ids(browser) == newest[:4], 20, "the next page, none skipped")


def _row_ids(driver: WebDriver) -> list[str | None]:
    return [r.get_attribute("data-job-id") for r in driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")]


def test_only_an_admin_sees_every_station(service: Service, browser: WebDriver, small_frame: Path) -> None:
    other = _submit(service, "b", small_frame, "only_for_admins.dng")
    _sign_in(browser, service.url, service.tokens["admin"])
    _until(lambda: _row_status(browser, other), 30, "studio-b's job in the admin's list")
    assert browser.find_element(By.ID, "f-station-wrap").is_displayed()
    text = browser.find_element(By.ID, "jobs").text
    assert "studio-a" in text and "studio-b" in text
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr"), 20, "the workers panel")
    assert "cpu" in browser.find_element(By.ID, "workers").text
    _until(lambda: "Night run" in browser.find_element(By.ID, "batches").text, 20, "studio-a's batches")
    station = browser.find_element(By.ID, "f-station")
    station.send_keys("studio-b")
    _until(lambda: "studio-a" not in browser.find_element(By.ID, "jobs").text, 20, "the station filter")
    _shot(browser, "06-admin-jobs")
    station.send_keys("-nobody")  # no such station: the error, and no rows left from studio-b
    _until(lambda: "not found" in browser.find_element(By.ID, "banner").text, 20, "the unknown station's error")
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr") == []
    assert browser.find_element(By.ID, "jobs-status").text == ""
    # Sign out, then in as a station in the same tab (no reload): nothing of the admin's stays, no poll runs
    # while signed out, and one poll loop runs after.
    browser.execute_script(RECORD_FETCH + MARK_SIGN_OUT)
    browser.find_element(By.ID, "signout").click()
    time.sleep(2)
    # a poll already on its way at the click may land (its answer is dropped); none may start after it
    assert [c for c in _calls(browser, "/v1/") if c["signedOut"]] == []
    assert browser.find_element(By.ID, "signin-error").text == ""
    _type_token(browser, service.tokens["a"])
    _until(lambda: "studio-a" in browser.find_element(By.ID, "who").text, 20, "station a again")
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr"), 20, "station a's jobs")
    assert _row_status(browser, other) is None and "studio-b" not in browser.find_element(By.ID, "jobs").text
    assert not browser.find_element(By.ID, "f-station-wrap").is_displayed()
    assert browser.find_element(By.ID, "f-station").get_attribute("value") == ""
    assert not browser.find_element(By.ID, "banner").is_displayed()
    before = len(_calls(browser, "/v1/jobs/changes"))
    time.sleep(3)
    assert len(_calls(browser, "/v1/jobs/changes")) - before <= 3  # two loops made 4 or more
    assert {c["auth"] for c in _calls(browser, "/v1/")} == {f"Bearer {service.tokens['a']}"}
    # An admin after a station in that tab sees every station's jobs (the station's change cursor is gone).
    browser.find_element(By.ID, "signout").click()
    _type_token(browser, service.tokens["admin"])
    _until(lambda: _row_status(browser, other), 20, "studio-b's job for the admin")
    assert "studio-a" in browser.find_element(By.ID, "jobs").text
