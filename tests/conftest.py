"""Shared test setup."""

import torch

# Tests use tiny tensors; one intra-op thread avoids oversubscribing shared CPUs (several times
# faster than the default thread pool on a loaded 2-core machine).
torch.set_num_threads(1)
