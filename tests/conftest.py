"""Shared test setup."""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# The test kits (model_testkit, inference_testkit, benchmark_testkit, training_testkit) are
# imported by tests in other folders too.
for kit in ("model", "inference", "benchmarks", "training"):
    path = str(Path(__file__).parent / kit)
    if path not in sys.path:
        sys.path.append(path)

# Tests use tiny tensors; one intra-op thread avoids oversubscribing shared CPUs (several times
# faster than the default thread pool on a loaded 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread_after_each_test() -> Iterator[None]:
    """Put back one thread after a test that ran a benchmark's ``--threads`` (they leave it set):
    the next tests in the worker would share its core with the other worker's."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config: object) -> int:
    """``-n auto``: a worker a core, at most 4 (each test uses one thread; the distributed tests
    start two processes of their own, and more workers would only share the same cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 4))


# The files that took longest (seconds, `pytest --durations=0` summed per file on a 2-core Zen 3,
# 2026-11-28), started first: xdist hands a worker a whole file at a time, so a long file begun
# last keeps one worker busy after the other has finished (pyproject's addopts turn off xdist's
# own order, most tests first, which put these files last). Largest first keeps the tail short.
SLOWEST_FILES = (
    "tests/training/test_distributed.py",  # 126
    "tests/training/test_trainer.py",  # 86
    "tests/cli/test_options_act.py",  # 77
    "tests/cli/test_fuzz.py",  # 62
    "tests/cli/test_translation_cli.py",  # 58 (106 before its smaller training run)
    "tests/parsing/test_parsing_end_to_end.py",  # 44
    "tests/training/test_prepared_distributed.py",  # 44
    "tests/export/test_huggingface_cli.py",  # 40
    "tests/training/test_translation_run.py",  # 32
    "tests/cli/test_decoding_tools_cli.py",  # 32
    "tests/test_rnn_end_to_end.py",  # 31
    "tests/test_experiments.py",  # 30
    "tests/export/test_huggingface_export.py",  # 29
)


def pytest_configure(config: pytest.Config) -> None:
    """A name in SLOWEST_FILES that is no file (renamed, removed) stops the run, rather than
    dropping out of the order unseen."""
    missing = [name for name in SLOWEST_FILES if not (config.rootpath / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SLOWEST_FILES names no file: {missing}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest files first (in SLOWEST_FILES' order), then the rest as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
