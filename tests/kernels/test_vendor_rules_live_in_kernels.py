"""Every CPU-library or vendor rule lives in ``transduce.kernels``: no other module of the package
names MKL, oneDNN (mkldnn), Intel or AMD, and neither the paper's model nor the inference engine
branches on the device type. The rest of the package says what it computes; kernels/ says how."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import transduce

PACKAGE = Path(transduce.__file__).parent
KERNELS = PACKAGE / "kernels"

# Word-bounded, any case: "oneDNN", "MKL's", "torch.backends.mkldnn", "AMD Zen 5"; not inside an
# identifier such as enlarge_onednn_cache (the word is then part of a name, read with it).
VENDOR = re.compile(r"\b(mkl|onednn|mkldnn|intel|amd)\b", re.IGNORECASE)

# "x.device.type == 'cpu'" and the like: the units that say only what they compute
DEVICE_BRANCH = re.compile(r"\bdevice\.type\b")
NO_DEVICE_BRANCHES = ("model", "inference/engine")


def _outside_kernels() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if KERNELS not in p.parents)


def _hits(
    pattern: re.Pattern[str], paths: list[Path], root: Path = PACKAGE
) -> dict[str, list[str]]:
    """'path/relative/to/root.py' -> ['file:line: text', ...] for lines matching ``pattern``."""
    found: dict[str, list[str]] = {}
    for path in paths:
        name = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.setdefault(name, []).append(f"{name}:{number}: {line.strip()}")
    return found


def test_no_module_outside_kernels_names_a_cpu_library_or_vendor() -> None:
    found = [line for lines in _hits(VENDOR, _outside_kernels()).values() for line in lines]
    assert not found, "move these rules into transduce/kernels/:\n" + "\n".join(found)


def test_model_and_engine_do_not_branch_on_the_device() -> None:
    paths = [p for unit in NO_DEVICE_BRANCHES for p in sorted((PACKAGE / unit).rglob("*.py"))]
    found = [line for lines in _hits(DEVICE_BRANCH, paths).values() for line in lines]
    assert not found, "ask transduce.kernels instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "y = F.linear(x, w)  # MKL's sgemm",
        "torch.backends.mkldnn.is_available()",
        "an AMD Zen 5",
        "CPUs made by Intel",
        "oneDNN's blocked layout",
    ],
)
def test_the_check_finds_a_vendor_word_with_its_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "module.py"
    path.write_text(f"a = 1\n{line}\n", encoding="utf-8")
    assert _hits(VENDOR, [path], tmp_path) == {"module.py": [f"module.py:2: {line}"]}
    path.write_text("enlarge_onednn_cache()  # Amdahl's law, intelligible\n", encoding="utf-8")
    assert _hits(VENDOR, [path], tmp_path) == {}
    branch = "if x.device.type == 'cpu':"
    path.write_text(branch + "\n", encoding="utf-8")
    assert _hits(DEVICE_BRANCH, [path], tmp_path) == {"module.py": [f"module.py:1: {branch}"]}


def test_the_kernels_package_is_where_the_rules_are() -> None:
    # the check would pass vacuously if kernels/ had moved or lost its rules
    assert _hits(VENDOR, sorted(KERNELS.rglob("*.py")))
