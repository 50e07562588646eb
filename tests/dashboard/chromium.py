"""Headless Chromium (Debian's chromium + chromium-driver packages) driven by selenium, for the dashboard's tests and
benchmark."""

from __future__ import annotations

import shutil
from typing import Any

INSTALL = (
    "install it with `apt-get install -y chromium chromium-driver` and `pip install selenium==4.51.0` "
    "(`make browser` installs Chromium; the dev extra has selenium)"
)


def missing() -> str | None:
    """Why headless Chromium cannot be driven here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return f"selenium is not installed: {INSTALL}"
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return f"chromium or chromedriver is not on PATH: {INSTALL}"
    return None


def start() -> Any:
    """A headless Chromium session (``.quit()`` it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--disable-gpu",
        "--no-first-run",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def wait_for(browser: Any, css: str, check: Any = bool, timeout: float = 10.0) -> list[Any]:
    """The elements matching ``css`` once ``check`` accepts them (the page renders after its fetches; elements that
    a re-render replaced while being checked are looked up again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, timeout, poll_frequency=0.01, ignored_exceptions=[StaleElementReferenceException])
    return wait.until(lambda driver: (found := driver.find_elements(By.CSS_SELECTOR, css)) and check(found) and found)
