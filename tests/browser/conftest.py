"""Headless Chromium (Debian's package, driven by Playwright) against the live admin.

CI installs the browser with ``.ci/install-browser``; without it these tests fail rather than
skip, so a green run always means the admin was really driven.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def browser(django_db_setup: None) -> Iterator[Browser]:
    """Chromium for one test module; the test database exists before its event loop starts."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run .ci/install-browser (Debian's chromium package)")
    # Playwright's sync API keeps an event loop running in this thread until it stops; Django
    # would refuse the tests' own ORM calls (factories, assertions, the flush after each test)
    # as if they came from async code. The loop, and so this permission, ends with the module.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    yield opened
    context.close()


@pytest.fixture
def screenshot(page: Page, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    """Save a full-page screenshot under artifacts/browser/ named after the test and ``step``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    test = re.sub(r"\W+", "_", request.node.name)

    def take(step: str) -> Path:
        path = ARTIFACTS / f"{test}-{step}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def log_in(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/admin/login/?next=/admin/pgjobs/job/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/admin/pgjobs/job/$"))
