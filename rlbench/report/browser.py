"""Headless Chromium, to look at a page as a person would: its DOM after scripts ran, its console
messages, a screenshot. Used by `rlbench report --screenshot`, the study screenshot script and the
tests of the report and of the asv dashboard."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlbench.errors import RlbenchError

BINARIES = ("chromium", "chromium-browser", "google-chrome")
# headless as root, with nothing fetched from the network but what the page asks for
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000")
_CONSOLE = re.compile(r':CONSOLE[:(]\d*\)?\]\s*"(.*)", source: (.*)$')


@dataclass
class Page:
    output: str  # the DOM (dump) or chromium's own report (screenshot)
    console: list[str]  # console messages the page printed, with their source
    returncode: int

    @property
    def errors(self) -> list[str]:
        return [line for line in self.console if re.search(r"Uncaught|Error|error|failed", line)]


def chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


def _run(extra: list[str], url: str, timeout: float) -> Page:
    binary = chromium()
    if binary is None:
        raise RlbenchError("no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="rlbench-chromium-") as profile:
        try:
            done = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RlbenchError(f"Chromium did not finish with {url} within {timeout:.0f} s") from None
    console = [f"{m.group(1)} ({m.group(2)})" for m in map(_CONSOLE.search, done.stderr.splitlines()) if m]
    return Page(done.stdout, console, done.returncode)


def dump_dom(url: str, timeout: float = 120) -> Page:
    return _run(["--dump-dom"], url, timeout)


def screenshot(url: str, png: str | Path, width: int = 1300, height: int = 2200, timeout: float = 120) -> Page:
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    page = _run([f"--screenshot={png}", f"--window-size={width},{height}", "--hide-scrollbars"], url, timeout)
    if page.returncode != 0 or not png.exists():
        raise RlbenchError(f"Chromium could not take a screenshot of {url}: {page.output.strip()[-300:]}")
    return page
