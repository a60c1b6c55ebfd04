"""Config machinery shared by every scenario kind: strict models, YAML files, dotted
``--set`` overrides, and one-line errors.

A user's mistake (unknown key, wrong type, bad value, unknown ``kind`` or ``dist``) becomes
a :class:`ConfigError` whose message names the field and what is allowed; the command line
prints it on one line and exits with status 2.
"""

from __future__ import annotations

import copy
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A user's configuration mistake; the message is one line naming the field."""


class _Strict(BaseModel):
    # strict: "4" is not a count, and true is not a number
    model_config = ConfigDict(extra="forbid", strict=True)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of scenario fields at the top level")
    return data


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with a dotted key; the value is read as YAML (so 2 is an int)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. policy.max_lag=2")
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for key ``a.b.c``, creating mappings on the way."""
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])} is not a mapping, cannot set {key}")
        node = child
    node[parts[-1]] = value


def with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        set_dotted(out, key, value)
    return out


def scenario_dict(scenario: BaseModel) -> dict[str, Any]:
    """The scenario as plain data, without unset optional fields (round-trips through YAML)."""
    return scenario.model_dump(mode="json", exclude_none=True)


# -- readable errors ------------------------------------------------------------------


def describe_error(error: ValidationError, data: Any, root: type[BaseModel]) -> str:
    """One line for the first problem: the field as the user wrote it, and what is allowed.

    ``root`` is the model that was validated; it is used to list
    the allowed keys of the mapping that holds an unknown one.
    """
    err = error.errors()[0]
    loc, kind = list(err["loc"]), err["type"]
    keyed = kind in ("missing", "extra_forbidden")  # the last element is a key, not a tag
    path = ".".join(str(p) for p in _user_path(loc, data, keyed)) or "(top level)"
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1], root)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{path}: unknown key{hint}"
    if kind == "missing":
        return f"{path}: required field is missing"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    scalar = value is None or isinstance(value, (str, int, float, bool))
    return f"{path}: {msg} (got {value!r})" if scalar and "input" in err else f"{path}: {msg}"


def _user_path(loc: list[Any], data: Any, keyed: bool) -> list[Any]:
    """Drop the union tags pydantic inserts into locations (``policy.bounded.max_lag``)."""
    out, node = [], data
    for i, part in enumerate(loc):
        is_key = keyed and i == len(loc) - 1
        if isinstance(node, dict) and part not in node and not is_key:
            continue  # a discriminator tag, not a key the user wrote
        out.append(part)
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            node = None
    return out


def _fields_at(loc: list[Any], root: type[BaseModel]) -> list[str]:
    """Field names of the model found by following ``loc`` (tags included) from ``root``."""
    node: Any = root
    for part in loc:
        node = _step(node, part)
        if node is None:
            return []
    node = _unwrap(node)
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[Any]:
    """The alternatives of a (possibly nested, annotated, optional) union."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [m for a in typing.get_args(tp) if a is not type(None) for m in _members(a)]
    return [tp]


def _step(node: Any, part: Any) -> Any:
    for member in _members(node):
        if typing.get_origin(member) is list and isinstance(part, int):
            return typing.get_args(member)[0]
        if isinstance(member, type) and issubclass(member, BaseModel):
            if isinstance(part, str) and part in member.model_fields:
                return member.model_fields[part].annotation
            for field in ("kind", "dist"):  # a discriminated member named by its tag
                f = member.model_fields.get(field)
                if f is not None and typing.get_args(f.annotation) == (part,):
                    return member
    return None
