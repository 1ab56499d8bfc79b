"""Shared test setup."""

import sys
from pathlib import Path

import torch

# The test kits (model_testkit, inference_testkit, benchmark_testkit) are imported by tests in
# other folders too.
for kit in ("model", "inference", "benchmarks"):
    path = str(Path(__file__).parent / kit)
    if path not in sys.path:
        sys.path.append(path)

# Tests use tiny tensors; one intra-op thread avoids oversubscribing shared CPUs (several times
# faster than the default thread pool on a loaded 2-core machine).
torch.set_num_threads(1)
