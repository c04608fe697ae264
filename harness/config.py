"""Resolve a task's configuration: preset, then a config file, then `--set key=value`.

Every key is checked against the task's pydantic Config, so an unknown key or a value of
the wrong type is an error that names the key and what is valid, before anything runs."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.records import SEED_MAX
from kernels import resolve_backend
from mixers import get_mixer
from mixers.base import layer_widths
from tasks.base import Task
from tasks.common.layer_config import LayerTaskConfig


class ConfigError(ValueError):
    """A configuration that cannot be resolved; the message says what and what is valid."""


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping that holds one key twice (PyYAML would keep the last without a word)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys in a mapping."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` merges; a key set beside it overrides the merged one on purpose
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = key in first_line
        except TypeError:
            continue  # an unhashable key: construct_mapping names it
        if seen:
            raise DuplicateKeyError(f"duplicate key {key!r} on line {key_node.start_mark.line + 1} (first on line "
                                    f"{first_line[key]}); a key may appear once in a mapping")
        first_line[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(text: str) -> Any:
    """yaml.safe_load, except that a mapping holding a key twice raises DuplicateKeyError."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A new dict: `over` merged into `base`, recursing into nested dicts."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted keys of a pydantic model; nested models are expanded, dict fields end in '.*'."""
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += valid_keys(ann, f"{prefix}{name}.")
        elif getattr(ann, "__origin__", None) is dict:
            keys.append(f"{prefix}{name}.*")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def parse_value(text: str) -> Any:
    """A --set value: YAML scalars, lists and mappings ('3', '1e-3', 'true', '[64, 128]')."""
    try:
        return load_yaml(text)
    except DuplicateKeyError:
        raise
    except yaml.YAMLError:
        return text


def apply_set(data: dict[str, Any], key: str, value: Any, model: type[BaseModel]) -> None:
    """Set dotted `key` in `data`, refusing keys that `model` does not have."""
    parts = key.split(".")
    current_model: type[BaseModel] | None = model
    node = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if current_model is not None:
            if part not in current_model.model_fields:
                raise ConfigError(f"unknown key {key!r}; valid keys: {', '.join(valid_keys(model))}")
            ann = current_model.model_fields[part].annotation
            nested = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            is_dict = getattr(ann, "__origin__", None) is dict
            if not last and nested is None and not is_dict:
                raise ConfigError(f"key {key!r}: {'.'.join(parts[: i + 1])} is a value, not a group")
            current_model = nested
        if last:
            node[part] = value
        else:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child


def load_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping of config overrides."""
    try:
        data = load_yaml(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values, got {type(data).__name__}")
    return data


def _format_validation(error: ValidationError, task: str) -> str:
    lines = []
    for err in error.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(config)"
        lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return f"invalid config for task {task!r}: " + "; ".join(lines)


def resolve_config(
    task: type[Task], preset: str, config_file: Path | None = None, sets: list[str] | None = None
) -> BaseModel:
    """Preset, then file, then --set overrides, validated by the task's Config."""
    if preset not in task.presets:
        raise ConfigError(f"unknown preset {preset!r} for task {task.name!r}; valid presets: {', '.join(task.presets)}")
    data = copy.deepcopy(task.presets[preset])
    if config_file is not None:
        override = load_config_file(config_file)
        for key in override:
            if key not in task.Config.model_fields:
                raise ConfigError(
                    f"unknown key {key!r} in {config_file}; valid keys: {', '.join(valid_keys(task.Config))}"
                )
        data = deep_merge(data, override)
    for item in sets or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        try:
            value = parse_value(text.strip())
        except DuplicateKeyError as e:
            raise ConfigError(f"--set {item!r}: {e}") from None
        apply_set(data, key.strip(), value, task.Config)
    try:
        return task.Config(**data)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, task.name)) from None
    except ValueError as e:  # a model_validator's own check
        raise ConfigError(f"invalid config for task {task.name!r}: {e}") from None


def check_task_takes(task_cls: type, mixer: str) -> None:
    """ConfigError when the task refuses the mixer (Task.check_mixer), before any work."""
    try:
        task_cls.check_mixer(mixer)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_task_config(task_cls: type, config: BaseModel, device_type: str) -> None:
    """ConfigError when the task says its config cannot run on this device (Task.check_config)."""
    try:
        task_cls.check_config(config, device_type)
    except ValueError as e:
        raise ConfigError(f"invalid config for task {task_cls.name!r}: {e}") from None


def check_seed(seed: int, option: str = "--seed") -> None:
    """ConfigError unless `seed` is one every random generator of a run takes (0..SEED_MAX)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{option} {seed!r} is out of range; valid seeds: integers from 0 to {SEED_MAX}")


def check_mixer_run(task_cls: type, mixer: str, config: BaseModel, device_type: str) -> None:
    """Everything about one mixer in a resolved config that `harness run` and `harness sweep`
    check before any run starts: the task takes the mixer, and its options are valid here."""
    check_task_takes(task_cls, mixer)
    validate_mixer_options(mixer, config, device_type)


def _mixer_layers(mixer: str, config: BaseModel) -> list[tuple[str, str, dict[str, Any], int | None, Any]]:
    """(where, mixer name, options, d_model, dtype) of each layer a task builds from `config`:
    the recall tasks' LM (`model.mixer`, then `model.per_mixer.<mixer>`), or the efficiency tasks'
    layer under test (`mixer`) and softmax baseline (`softmax`), with the task's sizes and dtype."""
    if isinstance(config, LayerTaskConfig):
        layers = []
        for where, name, options in (("mixer", mixer, config.mixer), ("softmax", "softmax", config.softmax)):
            spec = config.layer_spec(options)
            sized = {"num_heads": spec.num_heads, "head_dim": spec.head_dim, **options}  # as build_layer makes it
            layers.append((where, name, sized, spec.d_model, spec.dtype))
        return layers
    model = getattr(config, "model", None)
    if not hasattr(model, "mixer_options"):
        return []  # per_mixer names are checked by ModelConfig itself
    where = f"model.mixer (with model.per_mixer.{mixer})" if model.per_mixer.get(mixer) else "model.mixer"
    return [(where, mixer, model.mixer_options(mixer), model.d_model, None)]


def validate_mixer_options(mixer: str, config: BaseModel, device: str | None = None) -> None:
    """Check the options of every layer the task builds against the mixer's own Config, the
    layer widths against d_model, and (given the device type, "cpu" or "cuda") that a requested
    backend runs there for the layer's dtype. ConfigError names the option and what is valid."""
    for where, name, options, d_model, dtype in _mixer_layers(mixer, config):
        mixer_cls = get_mixer(name)
        try:
            mixer_config = mixer_cls.Config(**options)
        except ValidationError as e:
            problems = []
            for err in e.errors():
                loc = f"{where}.{'.'.join(str(p) for p in err['loc'])}"
                if err["type"] == "extra_forbidden":
                    problems.append(f"{loc}: not an option of {name} (valid options: "
                                    f"{', '.join(mixer_cls.Config.model_fields)})")
                else:
                    problems.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
            raise ConfigError(f"invalid options for mixer {name!r}: {'; '.join(problems)}") from None
        backend = getattr(mixer_config, "backend", "auto")
        if device is not None and backend != "auto":
            try:
                resolve_backend(mixer_cls.op_name, backend, device, dtype)
            except ValueError as e:
                raise ConfigError(f"invalid options for mixer {name!r} ({where}.backend): {e}") from None
        if isinstance(d_model, int):
            try:
                layer_widths(d_model, mixer_config)
            except ValueError as e:
                raise ConfigError(f"invalid options for mixer {name!r} ({where}): {e}") from None


# Options that choose how a run executes, not what it computes (the record still holds them):
# a run with one of them changed is the same run, so a sweep counts it done and resumes it.
EXECUTION_ONLY = (("optim", "compile"),)


def config_hash(mixer: str, task: str, config: dict[str, Any], seed: int) -> str:
    """A stable hash of everything that defines a run (EXECUTION_ONLY options left out)."""
    config = dict(config)
    for section, key in EXECUTION_ONLY:
        if isinstance(config.get(section), dict) and key in config[section]:
            config[section] = {k: v for k, v in config[section].items() if k != key}
    blob = json.dumps({"mixer": mixer, "task": task, "config": config, "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
