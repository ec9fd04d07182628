"""The page of `stfast serve` (GET /) in a real headless browser: Debian's chromium and chromium-driver, driven by
selenium. The test starts `stfast serve` as a user would, loads the page, clicks a point on the drawn training
area, pastes a route, submits it and reads the ETA off the page. Under CI=true a missing browser fails the test
(.ci/run installs it: apt-get install -y chromium chromium-driver); elsewhere it skips."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from _eta_run import CENTER, KM_PER_DEG, train_run

from stfast.train.trained import load_model

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,900"]
DEP = "2016-11-02T08:30"  # naive: read in the model's zone (this run's: a naive time is UTC)


def _need_browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing or pytest.importorskip("selenium") is None:
        msg = f"headless browser test needs {', '.join(missing)}: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _need_browser()
    pytest.importorskip("fastapi")
    import httpx

    d = tmp_path_factory.mktemp("page")
    _, ck = train_run(d)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", "serve", "--checkpoint", str(ck), "--port", str(port),
                             "--max-wait-ms", "2", "--no-access-log"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise AssertionError(f"stfast serve exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
            time.sleep(0.25)
        else:
            raise AssertionError("stfast serve did not answer /healthz within 60 s")
        yield url, load_model(ck, "cpu")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not fetch a browser or a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        opts.add_argument(f)
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def test_page_draws_the_area_and_shows_the_eta_of_a_route(server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, model = server
    browser.get(url + "/")
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#cells rect")) == len(model.route_defaults().area.cells)
    # a click on the drawing adds a point (lng, lat) inside the training area's bounding box
    svg = browser.find_element(By.ID, "map")
    ActionChains(browser).move_to_element_with_offset(svg, 10, 10).click().perform()
    pts = json.loads(browser.find_element(By.ID, "route").get_attribute("value"))
    x0, y0, x1, y1 = model.route_defaults().area.bbox
    assert len(pts) == 1 and x0 - 0.05 < pts[0][0] < x1 + 0.05 and y0 - 0.05 < pts[0][1] < y1 + 0.05
    # paste a route, pick a departure, submit
    route = [[CENTER[0], CENTER[1] + i * 0.3 / KM_PER_DEG] for i in range(10)]
    browser.find_element(By.ID, "clear").click()
    box = browser.find_element(By.ID, "route")
    box.clear()
    box.send_keys(json.dumps(route))
    browser.execute_script("document.getElementById('departure').value = arguments[0]", DEP)
    browser.find_element(By.ID, "submit").click()
    eta = WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "eta").get_attribute("data-eta-s"))
    want = model.eta([np.array(route)], [DEP])[0]
    assert float(eta) == pytest.approx(want, abs=0.05 + 1e-6)  # answers are rounded to 0.1 s (issue 62)
    shown = browser.find_element(By.ID, "eta").text
    assert f"{int(want // 60)} min" in shown and "2.70 km" in shown
    assert len(browser.find_elements(By.CSS_SELECTOR, "#pts circle")) == 10
    # a route outside the training area: the page shows the service's error, not a number
    box.clear()
    box.send_keys(json.dumps([[p[0] + 0.5, p[1]] for p in route]))
    browser.find_element(By.ID, "submit").click()
    err = WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "error").text)
    assert "422" in err and "outside the training area" in err and browser.find_element(By.ID, "eta").text == ""
