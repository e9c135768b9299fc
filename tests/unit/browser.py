"""Headless Chromium for the tests of `servefleet report`'s page (Debian's chromium package,
which bin/setup installs): screenshots and the DOM it builds, and where a colour is drawn."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    assert exe, "no chromium on the PATH: ./bin/setup installs Debian's chromium package"
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",  # as root (CI); without a display
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
            f"--user-data-dir={tmp / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def screenshot(tmp: Path, name: str, text: str, size: tuple[int, int]) -> Image.Image:
    source, shot = tmp / name, tmp / f"{name}.png"
    source.write_text(text)
    chromium(tmp, f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", source.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == size
    return image


def rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def near(pixel, colour: str, tolerance: int = 12) -> bool:
    """One pixel (r, g, b) in the colour, each channel within `tolerance`."""
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, rgb(colour), strict=True))


def mask(image: Image.Image, colour: str, tolerance: int = 12) -> np.ndarray:
    """Where the image has the colour (each channel within `tolerance`): a rows x columns array."""
    pixels = np.asarray(image, dtype=np.int16)
    return (np.abs(pixels - np.array(rgb(colour), dtype=np.int16)) <= tolerance).all(axis=2)


def bands(image: Image.Image, colour: str) -> list[tuple[int, int, int, float]]:
    """The regions of rows holding the colour (rows at most 40 apart join one): each as (first
    row, last row, pixels of the colour, their mean x)."""
    where = mask(image, colour)
    found: list[list[int]] = []
    for y in np.flatnonzero(where.any(axis=1)).tolist():
        if found and y - found[-1][1] <= 40:
            found[-1][1] = y
        else:
            found.append([y, y])
    out = []
    for first, last in found:
        ys, xs = np.nonzero(where[first : last + 1])
        out.append((first, last, len(xs), float(xs.mean())))
    return out


def charts(image: Image.Image, colour: str) -> list[tuple[int, int, int, float]]:
    """The bands big enough to be a chart's line and dots (the legend's dot is ~110 pixels)."""
    return [b for b in bands(image, colour) if b[2] >= 400]
