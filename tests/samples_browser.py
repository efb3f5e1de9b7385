"""A run's samples.html (mle_jax/reporting/samples_page.py) in a real browser: Debian's headless Chromium (`make apt`)
driven by playwright, opened from disk as a person opens it. The page must load nothing but itself: every request
that is not the file is refused and recorded, and so is every script error."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"  # Debian's package (Makefile APT_PKGS); playwright's own browsers are not installed


@dataclass
class Opened:
    page: Page
    errors: list[str] = field(default_factory=list)  # uncaught script errors and console errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for besides its own file


@contextlib.contextmanager
def open_page(path: Path) -> Iterator[Opened]:
    """The page at `path` loaded in headless Chromium (its scripts run: the load event has fired)."""
    url = path.resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # root: no setuid sandbox
        try:
            page = browser.new_page()
            opened = Opened(page)
            page.on("pageerror", lambda e: opened.errors.append(str(e)))
            page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)

            def refuse_others(route):
                if route.request.url == url:
                    return route.continue_()
                opened.requests.append(route.request.url)
                return route.abort()

            page.route("**/*", refuse_others)
            page.goto(url)
            yield opened
        finally:
            browser.close()


def rows(page: Page, key: str) -> list[str]:
    """The listed samples' cells of column `key`, top to bottom."""
    return page.locator(f"#samples tr.sample td[data-key='{key}']").all_inner_texts()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
