"""Shared test setup."""

import os
import sys
from pathlib import Path

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


def pytest_xdist_auto_num_workers(config: object) -> int:
    """``-n auto``: a worker a core, at most 4 (each test uses one thread; the distributed tests
    start two processes of their own, and more workers would only share the same cores)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 4))
