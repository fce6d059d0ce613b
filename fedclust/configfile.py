"""A config as a file: the YAML mapping of a config file (a key given twice
refused), ``KEY=VALUE`` overrides, each merged into a :class:`fedclust.schema.Config`
with its type checked (an unknown key named with the closest valid one), and
the config written back as config.yaml.

The schema (the keys, their types, defaults and meanings) is
:mod:`fedclust.schema`'s; the ranges are checked after parsing
(:func:`fedclust.config.load_config` does both).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import yaml

from fedclust.errors import ConfigError
from fedclust.schema import ALIASES, RENAMED_KEYS, Config, _field_types, choices, to_dict, valid_keys

KEYS_HINT = "see the valid keys with fedclust check --keys"


def _unknown_key(path: str) -> ConfigError:
    if path in RENAMED_KEYS:
        return ConfigError(path, "(renamed)", f"this key is now {RENAMED_KEYS[path]}: write {RENAMED_KEYS[path]}=VALUE")
    bare = path.lstrip("+~")
    if bare != path:    # Hydra's +key=value (add a key) or ~key (delete one)
        known = bare in valid_keys()
        return ConfigError(path, "(unknown key)",
                           f"a leading '{path[:len(path) - len(bare)]}' is Hydra syntax for adding or removing a key; "
                           "fedclust's keys all exist and are set as KEY=VALUE: "
                           + (f"write {bare}=VALUE" if known else f"'{bare}' is no key either; {KEYS_HINT}"))
    close = difflib.get_close_matches(path, valid_keys(), n=1, cutoff=0.5)
    if not close:  # try matching the last component alone
        last = path.rsplit(".", 1)[-1]
        close = [k for k in valid_keys() if k.rsplit(".", 1)[-1] == last][:1]
    if close:
        return ConfigError(path, "(unknown key)", f"did you mean '{close[0]}'? ({KEYS_HINT})")
    return ConfigError(path, "(unknown key)", f"no such key; {KEYS_HINT}")


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check a YAML value against the field's type (ints may fill floats)."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, value, "expected a whole number")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, value, "expected a number")
    if tp is list:   # a list of strings; one string may stand for a list of one
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if value is None:
            return []
        raise ConfigError(path, value, "expected a list of strings, e.g. [my_package.my_algorithm]")
    if tp is str or choices(tp) is not None:   # a choice is a string; check_choices checks which
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, bool):   # YAML 1.1 reads yes/no/on/off/true/false as booleans
            meant = ALIASES.get(path, {}).get(str(value).lower())
            raise ConfigError(path, value, "expected a string, and YAML reads yes, no, on, off, true and false as "
                              "booleans: " + (f"did you mean {path}={meant}?" if meant else
                                              f"quote the word to keep it, e.g. {path}='no'"))
        raise ConfigError(path, value, "expected a string")
    return value


def _plain_value(value: Any) -> bool:
    """A YAML scalar (string, number, true/false), or a list of them."""
    if isinstance(value, list):
        return all(_plain_value(v) and not isinstance(v, list) for v in value)
    return isinstance(value, (str, int, float, bool))


def _merge_mapping(path: str, current: dict, value: Any) -> dict:
    """A mapping key (``data.options``) merged as a section is: each key given replaces its value, a key set
    to null is dropped; an empty mapping or null clears it.  Keys are Python identifiers (keyword arguments),
    values YAML scalars or lists of them."""
    if value is None or value == {}:
        return {}
    example = f"e.g. {path}={{split: balanced}}, or one key: {path}.split=balanced"
    if not isinstance(value, dict):
        raise ConfigError(path, value, f"expected a mapping of keyword arguments, {example}")
    out = dict(current)
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(path, value, f"key {k!r} is no keyword argument name (a Python identifier); {example}")
        if v is None:
            out.pop(k, None)
        elif _plain_value(v):
            out[k] = v
        else:
            raise ConfigError(f"{path}.{k}", v, "expected a string, a number, true/false or a list of them")
    return out


def _merge(obj: Any, mapping: dict, prefix: str = "") -> None:
    types = _field_types(type(obj))
    if not isinstance(mapping, dict):
        raise ConfigError(prefix.rstrip(".") or "(top level)", mapping, "expected a mapping of keys")
    sections = obj.__dict__.get("sections") if isinstance(obj, Config) else None
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if sections is not None and key in sections:
            _merge(sections[key], value or {}, path + ".")
            continue
        if key not in types:
            while isinstance(value, dict) and value:  # name the full dotted key of a misspelt section
                key, value = next(iter(value.items()))
                path = f"{path}.{key}"
            raise _unknown_key(path)
        tp = types[key]
        if dataclasses.is_dataclass(tp):
            _merge(getattr(obj, key), value or {}, path + ".")
        elif tp is dict:
            setattr(obj, key, _merge_mapping(path, getattr(obj, key), value))
        else:
            setattr(obj, key, _coerce(path, value, tp))


def set_key(cfg: Config, path: str, value: Any) -> None:
    """Set one dotted key, with the same checks as a file."""
    parts = path.split(".")
    nested: dict = {}
    cur = nested
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    _merge(cfg, nested)


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value parsed as YAML scalar)."""
    if "=" not in text:
        raise ConfigError(text, "(override)", "write overrides as KEY=VALUE, e.g. algorithm.k=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML
    keeps the last silently), naming its dotted path and both lines."""

    def construct_document(self, node):
        self._refuse_duplicates(node, "")
        return super().construct_document(node)

    def _refuse_duplicates(self, node, prefix: str) -> None:
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                self._refuse_duplicates(item, prefix)
            return
        if not isinstance(node, yaml.MappingNode):
            return
        seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # <<: *anchor merges on purpose
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            path = f"{prefix}{key}"
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(path, "(given twice)",
                                  f"{key_node.start_mark.name} sets it on line {seen[key]} and again on line "
                                  f"{line}; YAML would keep only the last: keep one (merge the two blocks)")
            seen[key] = line
            self._refuse_duplicates(value_node, path + ".")


def read_yaml(path) -> dict:
    """The mapping in a YAML config file (ConfigError naming the file if it
    is missing, not YAML, or sets a key twice)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ConfigError("CONFIG", str(path), "no such file; pass a YAML file such as configs/fmnist_rotation2.yaml")
    try:
        with open(p, encoding="utf-8") as stream:   # marks name the file by its path
            raw = yaml.load(stream, Loader=_StrictLoader) or {}
    except yaml.YAMLError as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ConfigError("CONFIG", str(path), f"not valid YAML: {text}") from None
    if not isinstance(raw, dict):
        raise ConfigError("CONFIG", str(path), "must hold a mapping of keys, e.g. 'clients: 100'")
    return raw


def parse(raw: dict | None, overrides=()) -> Config:
    """A Config from a YAML mapping and ``KEY=VALUE`` overrides, types
    checked, values not yet validated (:func:`fedclust.config.load_config`
    does both)."""
    cfg = Config()
    if raw:
        _merge(cfg, raw)
    for text in overrides:
        key, value = parse_override(text)
        set_key(cfg, key, value)
    return cfg


# libyaml's emitter where PyYAML has it (0.06 s of a small run's start in the pure-Python one); the same text
# (tests/unit/test_config.py compares the two)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(cfg: Config) -> str:
    """config.yaml's text: :func:`fedclust.schema.to_dict` as YAML, the keys in their order."""
    return yaml.dump(to_dict(cfg), Dumper=_DUMPER, sort_keys=False)
