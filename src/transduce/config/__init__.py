"""Configuration as frozen, typed dataclasses, checked on construction; presets are data.

A run's configuration has four sections, ``model``, ``train``, ``task`` and ``decode``. The task
section is the dataclass of the task named: ``SyntheticTaskConfig`` (copy, reverse, addition) or
``TranslationTaskConfig``, each with its own keys only. Every key name is unique across sections,
so a command-line override can name a key alone (``--set d_model=256``) or with its section
(``--set model.d_model=256``). Unknown keys, a key of another task, a key of the other
architecture off its default (``ARCHITECTURE_KEYS``), values of the wrong type or out of range
are ``UserError``s naming the key, whether the config comes from a file, the command line or
Python (``ModelConfig(n_heads=0)``).

The package: ``sections`` (the dataclasses), ``values`` (type checks of values), ``loading``
(files, presets, overrides).
"""

from transduce.config.loading import (
    KEY_SECTION,
    check_preset_acts,
    coerce,
    from_dict,
    load_config,
    parse_overrides,
    preset_config,
    resolve_key,
    update,
)
from transduce.config.sections import (
    ARCHITECTURE_KEYS,
    MAX_ALPHA,
    MAX_LEN_OFFSET,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    TASKS,
    Config,
    DecodeConfig,
    ModelConfig,
    ParsingTaskConfig,
    SyntheticTaskConfig,
    TaskConfig,
    TrainConfig,
    TranslationTaskConfig,
)

__all__ = [
    "ARCHITECTURE_KEYS",
    "KEY_SECTION",
    "MAX_ALPHA",
    "MAX_LEN_OFFSET",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "TASKS",
    "Config",
    "DecodeConfig",
    "ModelConfig",
    "ParsingTaskConfig",
    "SyntheticTaskConfig",
    "TaskConfig",
    "TrainConfig",
    "TranslationTaskConfig",
    "check_preset_acts",
    "coerce",
    "from_dict",
    "load_config",
    "parse_overrides",
    "preset_config",
    "resolve_key",
    "update",
]
