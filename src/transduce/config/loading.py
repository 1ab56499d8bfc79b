"""Configs from files, presets and ``--set`` overrides: every key resolved to its section,
every value typed (``values``), the result built as the frozen dataclasses of ``sections``."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Literal

from transduce.config.sections import (
    _TASK_CLASSES,
    ARCHITECTURE_KEYS,
    SAMPLING_KEYS,
    SYNTHETIC_UNREAD,
    TASKS,
    Config,
    DecodeConfig,
    ModelConfig,
    TaskConfig,
    TrainConfig,
)
from transduce.config.values import _hints, _typed
from transduce.errors import UserError
from transduce.presets import PRESETS

_SECTION_TYPES: dict[str, tuple[type, ...]] = {
    "model": (ModelConfig,),
    "train": (TrainConfig,),
    "task": _TASK_CLASSES,
    "decode": (DecodeConfig,),
}


# Key name -> section; names are unique across sections (a test checks it).
KEY_SECTION: dict[str, str] = {
    f.name: section
    for section, classes in _SECTION_TYPES.items()
    for cls in classes
    for f in fields(cls)
}


def _key_class(section: str, key: str) -> type:
    """The dataclass of ``section`` that has ``key`` (for task keys: the task that has it)."""
    return next(cls for cls in _SECTION_TYPES[section] if key in _hints(cls))


def coerce(section: str, key: str, value: Any) -> Any:
    """Check, and for strings from the command line or whole floats from a file convert,
    ``value`` for ``section.key``."""
    if (section, key) == ("task", "name"):  # every task's name
        return _typed("task.name", Literal[tuple(TASKS)], value, from_text=True)
    return _typed(f"{section}.{key}", _hints(_key_class(section, key))[key], value, from_text=True)


def resolve_key(key: str) -> tuple[str, str]:
    """'d_model' or 'model.d_model' -> ('model', 'd_model'); unknown keys are UserErrors."""
    if "." in key:
        section, name = key.split(".", 1)
        if section not in _SECTION_TYPES:
            raise UserError(
                f"unknown config section {section!r} in {key!r}; "
                f"sections are {', '.join(_SECTION_TYPES)}"
            )
        if KEY_SECTION.get(name) != section:
            raise UserError(f"unknown config key {key!r}")
        return section, name
    if key not in KEY_SECTION:
        raise UserError(f"unknown config key {key!r}")
    return KEY_SECTION[key], key


def _updated_task(task: TaskConfig, changes: dict[str, Any]) -> TaskConfig:
    """``task`` with ``changes``; a new ``name`` of another task starts from that task's
    defaults. A key the (new) task does not have is a UserError naming it."""
    cls = TASKS[changes.get("name", task.name)]
    for key in changes:
        if key not in _hints(cls):
            keys = ", ".join(f.name for f in fields(cls))
            raise UserError(f"task.{key} is not a key of task {cls.__name__} (its keys: {keys})")
    if not isinstance(task, cls):  # another kind of task: the old one's settings would be lost
        lost = [
            f.name
            for f in fields(task)
            if f.name not in _hints(cls) and getattr(task, f.name) != f.default
        ]
        if lost:
            raise UserError(
                f"task.name {changes.get('name', task.name)}: the config's {task.name} settings "
                f"({', '.join(f'task.{k}' for k in lost)}) are not of that task; start from a "
                "config of it"
            )
        return cls(**changes)
    name = changes.get("name", task.name)
    if name != task.name:  # another synthetic task: the keys it does not read from defaults
        defaults = {f.name: f.default for f in fields(cls)}
        changes = {**{k: defaults[k] for k in SYNTHETIC_UNREAD.get(name, ())}, **changes}
    return replace(task, **changes)


def _updated_model(model: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """``model`` with ``changes``; a new ``architecture`` starts the keys only the old one reads
    from their defaults (a Transformer's config trained with ``--set architecture=rnn``), as a
    new task starts from its own. Such a key given with the change is refused by the check."""
    if changes.get("architecture", model.architecture) != model.architecture:
        defaults = {f.name: f.default for f in fields(ModelConfig)}
        changes = {**{k: defaults[k] for k in ARCHITECTURE_KEYS[model.architecture]}, **changes}
    return replace(model, **changes)


def update(cfg: Config, values: dict[str, Any]) -> Config:
    """Return ``cfg`` with flat or dotted keys replaced; values are type-checked."""
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, name = resolve_key(key)
        by_section.setdefault(section, {})[name] = coerce(section, name, value)
    sections: dict[str, Any] = {}
    for section, changes in by_section.items():
        if section == "task":
            sections[section] = _updated_task(cfg.task, changes)
        elif section == "model":
            sections[section] = _updated_model(cfg.model, changes)
        else:
            sections[section] = replace(getattr(cfg, section), **changes)
    return replace(cfg, **sections)  # one Config: its checks across sections see every change


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """['d_model=256', ...] -> {'d_model': '256'}; a key given twice (``max_steps`` and
    ``train.max_steps`` are one) is a UserError: which of the two was meant?"""
    out: dict[str, str] = {}
    seen: dict[tuple[str, str], str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        key = key.strip()
        resolved = resolve_key(key)  # an unknown key: a UserError naming it
        if resolved in seen:
            raise UserError(f"--set {key} and --set {seen[resolved]} set one key twice")
        seen[resolved] = key
        out[key] = value.strip()
    return out


def preset_config(name: str) -> Config:
    """The Config of preset ``name`` (``transduce.presets``); an unknown name is a UserError
    listing the known ones."""
    if not isinstance(name, str) or name not in PRESETS:  # a YAML list or mapping too
        raise UserError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return update(Config(), PRESETS[name])


def from_dict(data: dict[str, Any], *, source: str = "config", stored: bool = False) -> Config:
    """Build a Config from nested sections (a parsed YAML file); ``preset`` names a base.

    ``stored``: a config kept inside a checkpoint. Those written before the task section was
    split by task hold every task's keys, and those written before the keys of the other
    architecture (or sampling's settings without sampling) were refused may hold some off their
    defaults (unread); the keys of other tasks, of the other architecture and of sampling where
    it is off are dropped there."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    data = dict(data)
    preset = data.pop("preset", None)
    try:
        cfg = preset_config(preset) if preset is not None else Config()
        flat: dict[str, Any] = {}
        for section, values in data.items():
            if section not in _SECTION_TYPES:
                raise UserError(
                    f"unknown section {section!r}; sections are preset, {', '.join(_SECTION_TYPES)}"
                )
            if not isinstance(values, dict):
                raise UserError(f"section {section!r} must be a mapping")
            if stored and section == "task":
                name = values.get("name", cfg.task.name)
                keys = set(_hints(TASKS[name])) - set(SYNTHETIC_UNREAD.get(name, ()))
                values = {k: v for k, v in values.items() if k in keys}
            if stored and section == "model":
                unread = _keys_unread_by(values.get("architecture", cfg.model.architecture))
                values = {k: v for k, v in values.items() if k not in unread}
            if stored and section == "decode" and not values.get("sampling", False):
                # written before sampling's settings were refused without it (unread there)
                values = {k: v for k, v in values.items() if k not in SAMPLING_KEYS}
            for key, value in values.items():
                flat[f"{section}.{key}"] = value
        cfg = update(cfg, flat)
        if preset is not None and not stored:
            check_preset_acts(preset, cfg)
        return cfg
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def check_preset_acts(preset: str, cfg: Config) -> None:
    """A UserError when every key preset ``preset`` sets is one ``cfg``'s architecture does not
    read (row E's learned positions, or A1's heads, under ``architecture: rnn``): the preset,
    a base whose other architecture's keys start from their defaults, would change nothing."""
    keys = list(PRESETS[preset])
    unread = _keys_unread_by(cfg.model.architecture)
    if keys and all(key in unread for key in keys):
        raise UserError(
            f"preset {preset} sets only {', '.join(keys)}, which architecture: "
            f"{cfg.model.architecture} does not read: it would change nothing"
        )


def _keys_unread_by(architecture: Any) -> set[str]:
    """The keys of the architectures other than ``architecture`` (all of them for a name no
    architecture has: the check of ``architecture`` names that)."""
    return {k for owner, keys in ARCHITECTURE_KEYS.items() if owner != architecture for k in keys}


def _unique_keys_loader() -> Any:
    """PyYAML's SafeLoader refusing a key written twice in one mapping (it keeps the last in
    silence; TOML refuses it): a ConstructorError at the second."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges a mapping in: its
                    continue  # keys may be given again here (that is what it is for)
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):  # a list or mapping as a key
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        "a key must be a name, not a list or mapping",
                        key_node.start_mark,
                    )
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is given twice", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeys


def load_config(path: str | Path) -> Config:
    """Read a config file (see ``configs/``): TOML if its name ends in ``.toml``, else YAML.
    Both hold the same sections and keys."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read ({e})") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark, as editors on Windows write
    if p.suffix.lower() == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{p}: not valid TOML: {e}") from None
    else:
        import yaml

        try:
            data = yaml.load(text, Loader=_unique_keys_loader())  # a SafeLoader
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            problem = getattr(e, "problem", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise UserError(f"{p}: not valid YAML: {where}{problem or e}") from None
    if not data:  # it would train the default task (addition) as if that had been asked for
        raise UserError(f"{p}: holds no settings (it would train the default task; see configs/)")
    return from_dict(data, source=str(p))
