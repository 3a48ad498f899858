"""The dashboard as a person uses it: a real headless Chromium (Debian's, driven by Selenium through Debian's
chromedriver; nothing downloads a browser) against the real service: uvicorn API, Redis, a coordinator and a
CPU worker as processes, synthetic DNGs. Screenshots go to test-output/browser/ (CI keeps them)."""

from __future__ import annotations

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

from tests.conftest import backend_url, configure, reset_database

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver); .ci/run "
           "installs them")]
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "browser"
XSS_NAME = "<img src=x onerror=alert(1)>.dng"


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
    specs += worker_specs(Settings(**{"cpu_workers": 1}))
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
    driver = webdriver.Chrome(service=DriverService(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


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


def _sign_in(driver: WebDriver, url: str, token: str) -> None:
    d = driver
    d.get(url + "/")
    d.execute_script("sessionStorage.clear()")
    d.get(url + "/")
    field = _until(lambda: d.find_element(By.ID, "token").is_displayed() and d.find_element(By.ID, "token"), 20,
                   "the sign-in form")
    field.send_keys(token)  # type: ignore[union-attr]
    d.find_element(By.CSS_SELECTOR, "#signin-form button").click()


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
                                                      synth_dir: Path) -> None:
    frame = synth_dir / "iq3s" / "frame_00.dng"
    other = _submit(service, "b", frame, "studio_b_shot.dng")
    _sign_in(browser, service.url, service.tokens["a"])
    _until(lambda: "studio-a" in browser.find_element(By.ID, "who").text, 20, "the signed-in banner")
    job = _submit(service, "a", frame, "portrait_001.dng")
    xss = _submit(service, "a", frame, XSS_NAME)
    seen: list[str] = []

    def done() -> bool:
        status = _row_status(browser, job)
        if status and (not seen or seen[-1] != status):
            seen.append(status)
        return status == "done"

    _until(done, 180, "the job to be done in the list")
    assert seen[0] in ("queued", "running") and seen[-1] == "done", seen
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
    browser.set_window_size(820, 1180)  # a tablet
    _shot(browser, "03-station-jobs-tablet")
    browser.set_window_size(1366, 900)


def test_job_detail_shows_preview_timeline_and_downloads(service: Service, browser: WebDriver,
                                                          synth_dir: Path) -> None:
    job = _submit(service, "a", synth_dir / "iq3s" / "frame_00.dng", "detail_shot.dng")
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
    browser.refresh()  # the page stops polling once a job is done
    _until(lambda: "Files removed" in browser.find_element(By.ID, "downloads").text, 30, "the removal shown")
    assert "Download" not in browser.find_element(By.ID, "downloads").text
    assert "went with the files" in browser.find_element(By.ID, "preview-caption").text
    _shot(browser, "07-job-files-removed")


def test_only_an_admin_sees_every_station(service: Service, browser: WebDriver, synth_dir: Path) -> None:
    other = _submit(service, "b", synth_dir / "iq3s" / "frame_00.dng", "only_for_admins.dng")
    _sign_in(browser, service.url, service.tokens["admin"])
    _until(lambda: _row_status(browser, other), 30, "studio-b's job in the admin's list")
    assert browser.find_element(By.ID, "f-station-wrap").is_displayed()
    text = browser.find_element(By.ID, "jobs").text
    assert "studio-a" in text and "studio-b" in text
    _until(lambda: browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr"), 20, "the workers panel")
    assert "cpu" in browser.find_element(By.ID, "workers").text
    assert browser.find_element(By.ID, "batches-empty").text  # the batches panel copes with a 404
    station = browser.find_element(By.ID, "f-station")
    station.send_keys("studio-b")
    _until(lambda: "studio-a" not in browser.find_element(By.ID, "jobs").text, 20, "the station filter")
    _shot(browser, "06-admin-jobs")
    _sign_in(browser, service.url, service.tokens["a"])
    _until(lambda: "studio-a" in browser.find_element(By.ID, "who").text, 20, "station a again")
    time.sleep(2)
    assert _row_status(browser, other) is None
