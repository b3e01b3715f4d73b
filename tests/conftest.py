"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_fakes import RealCluster, Stack, make_stack


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A gateway over fake parties (tests/service_fakes.py), for one test; over the real
    party daemons (in this process, the MPyC engine) in a module that sets
    ``PARTY_DAEMONS = True``; the fake parties hold every job running until released
    in a module that sets ``HOLD_JOBS = True``. A module may define its own ``stack``
    where it needs another."""
    daemons = getattr(request.module, "PARTY_DAEMONS", False)
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",))
                   if daemons else None)
    if getattr(request.module, "HOLD_JOBS", False):
        s.cluster.hold = True
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _logging_ends_with_its_test() -> Iterator[None]:
    """A test that runs a daemon's command in this process (`party serve`, `gateway
    serve`) has it configure the root logger onto that test's captured stderr; left in
    place, every later test's log lines would go to a closed stream, each a "Logging
    error" on the next test's stderr. Its handlers and level end with it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers and not type(h).__module__.startswith("_pytest"):
            root.removeHandler(h)
    root.setLevel(level)


# the web console's tests drive it in Debian's headless Chromium
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[object]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
