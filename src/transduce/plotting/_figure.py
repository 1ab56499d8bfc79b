"""What the figures share: the output check, a figure on the Agg canvas, a style context, saving.

matplotlib is imported here, inside functions, so that importing ``transduce.plotting`` works
without it; pyplot is never used (no global figure registry, no display).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transduce.errors import UserError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def check_output(output: Path | str, suffixes: Sequence[str] = IMAGE_SUFFIXES) -> Path:
    """``output`` as a Path when its suffix is one of ``suffixes``; a UserError otherwise."""
    path = Path(output)
    if path.suffix.lower() not in suffixes:
        raise UserError(
            f"{path}: cannot tell the figure format from the suffix {path.suffix or '(none)'!r}; "
            f"expected one of {', '.join(suffixes)}"
        )
    return path


def matplotlib_module() -> Any:  # noqa: ANN401 - the matplotlib module
    """matplotlib, or a UserError saying how to install it."""
    try:
        import matplotlib
    except ImportError as e:
        raise UserError(
            "plotting needs matplotlib: pip install 'transduce[plot]' (or pip install matplotlib)"
        ) from e
    return matplotlib


def _style() -> dict[str, Any]:
    # A fresh dict each time: rc_context applies it to these figures only.
    return {
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.fonttype": "none",  # SVG text stays text (searchable, small)
        "pdf.fonttype": 42,
    }


@contextlib.contextmanager
def style() -> Iterator[None]:
    """The house style for the figures drawn inside; rcParams come back unchanged after."""
    mpl = matplotlib_module()
    with mpl.rc_context(_style()):
        yield


def new_figure(width: float, height: float) -> Figure:
    """An empty figure, ``width`` x ``height`` inches, on an Agg canvas with constrained layout."""
    matplotlib_module()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, output: Path, dpi: int = 110) -> Path:
    """Writes ``fig`` to ``output`` in the format its suffix names (parents made); returns it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    # No creation date: the same data gives the same file.
    metadata = {"Date": None} if output.suffix.lower() in (".svg", ".pdf") else None
    fig.savefig(output, dpi=dpi, metadata=metadata)
    return output


def distinct_colors(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct RGBA colours: tab10 up to 10, then evenly spaced hues."""
    mpl = matplotlib_module()
    if n <= 10:
        return [mpl.colormaps["tab10"](i) for i in range(n)]
    return [mpl.colormaps["hsv"](i / n) for i in range(n)]
