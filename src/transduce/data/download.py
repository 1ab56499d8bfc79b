"""Downloading one file from a public URL (only when a user asks: ``transduce data ...``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from transduce.errors import UserError


def download(url: str, out: Path, *, timeout: float, progress: bool, offline_hint: str) -> None:
    """Write ``url`` (any URL urllib opens, ``file://`` included) to ``out``, with a byte
    progress bar when ``progress``. Every failure is a UserError naming the URL;
    ``offline_hint`` tells a user without network what to do instead."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(out, "wb") as f:
            total = r.headers.get("Content-Length")
            with tqdm(
                total=int(total) if total and total.isdigit() else None,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=url.rsplit("/", 1)[-1],
                disable=not progress,
                leave=False,
            ) as bar:
                while chunk := r.read(1 << 16):
                    f.write(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise UserError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise UserError(f"cannot download {url}: {e.reason}; {offline_hint}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot download {url}: {e}") from None


__all__ = ["download"]
