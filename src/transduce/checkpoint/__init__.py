"""Model files and checkpoints: a safe file format, atomic writes, the last K kept, loading with
clear errors, averaging (section 6.1), and the model and vocabulary a file holds
(``load_model``).

**The format.** Every file transduce writes is a ``torch.save`` archive of one dict holding only
tensors and plain data (dict, list, tuple, str, int, float, bool, None, bytes) with
``"format": FORMAT`` (2), read back with ``torch.load(weights_only=True)``: PyTorch's restricted
unpickler, which builds tensors and containers and calls no other code, so a tampered file cannot
run anything. A model file (``model.pt``, ``best.pt``, an average) holds ``format``, ``config``
(``Config.to_dict()``), ``vocab`` (``Vocab.to_dict()``) and ``model`` (the state dict), which is
all that translation needs; a training checkpoint (``checkpoints/step_N.pt``) adds ``optimizer``,
``scaler``, ``progress``, ``rng`` and ``rng_ranks`` (random states as lists and tensors, see
``training/rng.py``), ``precision`` (as resolved on the device) and, for a run with BPE-dropout,
``drawn`` (the current epoch's pairs: ``BatchFeed.draw_state``) for resuming; an average adds
``averaged`` (the files averaged).

Files written before format 2 (pickles holding NumPy objects, or dicts without ``format``) are
refused with a one-line UserError naming the remedy, ``transduce convert OLD NEW --trust``
(``convert``): the one place that unpickles a file the general way, only when asked to.

``save_safetensors`` writes the model of a file as safetensors (tied weights stored once, the
config and vocabulary in its metadata) for other tools; ``load_model`` reads those too.
"""

from transduce.checkpoint.files import (
    FORMAT,
    UnsafeCheckpoint,
    convert_remedy,
    load,
    save,
    save_atomic,
    to_plain,
    write_text_atomic,
)
from transduce.checkpoint.models import (
    check_finite,
    convert,
    load_model,
    load_safetensors,
    safetensors_available,
    save_model_file,
    save_safetensors,
    vocab_from_dict,
)
from transduce.checkpoint.runs import (
    average,
    last_checkpoints,
    prune,
    step_checkpoints,
    step_path,
)

__all__ = [
    "FORMAT",
    "UnsafeCheckpoint",
    "average",
    "check_finite",
    "convert",
    "convert_remedy",
    "last_checkpoints",
    "load",
    "load_model",
    "load_safetensors",
    "prune",
    "safetensors_available",
    "save",
    "save_atomic",
    "save_model_file",
    "save_safetensors",
    "step_checkpoints",
    "step_path",
    "to_plain",
    "vocab_from_dict",
    "write_text_atomic",
]
