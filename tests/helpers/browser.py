"""Headless Chromium for the console's browser tests: Debian's `chromium` and
`chromium-driver` through Selenium (nothing downloaded). `browser()` skips the test, saying
why, where either is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"
WIDTH, HEIGHT = 1280, 800


@contextmanager
def browser(width: int = WIDTH, height: int = HEIGHT) -> Iterator[Any]:
    """A headless Chromium window of `width` x `height` CSS pixels, quit afterwards."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    binary = next((p for name in CHROMIUM if (p := shutil.which(name))), None)
    driver_path = shutil.which(DRIVER) or shutil.which(DRIVER, path="/usr/lib/chromium")
    if binary is None or driver_path is None:
        pytest.skip(
            "no chromium and chromium-driver here (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=driver_path)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        viewport(driver, width, height)
        yield driver
    finally:
        driver.quit()


def viewport(driver: Any, width: int, height: int, *, mobile: bool = False) -> None:
    """Make the page's viewport exactly `width` x `height` CSS pixels (what a screenshot
    holds), as a phone when `mobile`."""
    driver.set_window_size(width, height)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )
