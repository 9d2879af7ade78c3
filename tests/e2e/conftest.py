"""Browser tests: Playwright driving Debian's Chromium against a real Daphne (websockets included)."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # sync Playwright runs an event loop in the test thread

CHROMIUM = next(
    (
        p
        for p in (os.environ.get("PEARL_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
        if p and os.path.exists(p)
    ),
    None,
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """Module-scoped: sync Playwright keeps an event loop running in this thread while it is open,
    which later asyncio-based tests must not inherit."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.js_errors = errors  # a test may assert the page raised nothing
    yield pg
    context.close()
