"""Debian's Chromium under Playwright, for the tests that look at pages (the run report, the
viewer): found on PATH, required where CI says so, launched headless without a sandbox."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from typing import Any

import pytest

__all__ = ["CHROMIUM", "colored_pixels", "launched", "require_chromium"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def require_chromium() -> str:
    """Chromium's path; the test fails without it where ``EVALQ_REQUIRE_CHROMIUM`` is set (CI),
    and is skipped elsewhere."""
    if CHROMIUM is None:
        if os.environ.get("EVALQ_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required (EVALQ_REQUIRE_CHROMIUM) but not installed")
        pytest.skip("needs chromium (apt-get install chromium)")
    return CHROMIUM


@contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium browser (Playwright's ``Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    path = require_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def colored_pixels(png: bytes) -> int:
    """Pixels that are clearly coloured (bars, lines), not white, grey or black text."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(BytesIO(png)).convert("RGB"), dtype=np.int16)
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 60).sum())
