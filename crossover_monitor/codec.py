"""One way between the frozen dataclasses and JSON-shaped data (stdlib only).

``to_data`` turns a dataclass (with enums, tuples, nested dataclasses) into plain JSON data;
``from_data`` builds the dataclass back from such data, checking every field against its
annotation and naming the field at fault (``timing.samples_s[3]: expected a number, got 'x'``),
and every string it reads as printable text (``text.printable``): JSON's ``"\\ud800"`` decodes to
a lone surrogate that no UTF-8 encoder takes, its ``"\\u0000"`` to a NUL that no XML holds.
The worker protocol, the run history, ``once --json`` and ``plot --from-json`` all go through it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from crossover_monitor.text import abridged, printable

T = TypeVar("T")
Text = Callable[[str], str]  # what each string read becomes


class DecodeError(ValueError):
    """Data that does not fit the type expected, with the path of the field at fault."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path or 'the message'}: {message}")


def parse_json(text: str | bytes) -> Any:
    """``json.loads``, with a document nested too deep for the parser (a hand-edited or hostile file, a
    worker's garbage) a ValueError like any other bad JSON, not a RecursionError that escapes every handler."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def to_data(value: Any) -> Any:
    """Plain JSON data: dataclasses as objects, enums as their values, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


def from_data(cls: type[T], data: Any, path: str = "", *, verbatim: bool = False) -> T:
    """An instance of the dataclass ``cls`` from ``data``; raises DecodeError naming the field at fault.

    Its strings are made printable text, unless ``verbatim``: for the daemon's plan, which the worker must match
    as the settings wrote it.
    """
    return typing.cast("T", _decode(cls, data, path, _as_written if verbatim else printable))


def _as_written(text: str) -> str:
    return text


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(annotation: Any, data: Any, path: str, text: Text) -> Any:  # noqa: C901, PLR0911, PLR0912 - one case per kind of annotation
    origin = get_origin(annotation)
    if annotation is Any:
        return data
    if origin in (Union, types.UnionType):
        options = get_args(annotation)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _decode(option, data, path, text)
            except DecodeError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else DecodeError(path, f"unexpected value {abridged(data)}")
    if origin is Literal:
        if data not in get_args(annotation):
            raise DecodeError(
                path, f"expected one of {', '.join(map(repr, get_args(annotation)))}, got {abridged(data)}"
            )
        return data
    if origin is tuple:
        args = get_args(annotation)
        if not isinstance(data, list | tuple):
            raise DecodeError(path, f"expected a list, got {abridged(data)}")
        if len(args) == 2 and args[1] is Ellipsis:  # noqa: PLR2004 - tuple[X, ...]
            return tuple(_decode(args[0], item, f"{path}[{i}]", text) for i, item in enumerate(data))
        if len(args) != len(data):
            raise DecodeError(path, f"expected {len(args)} items, got {len(data)}")
        return tuple(
            _decode(arg, item, f"{path}[{i}]", text) for i, (arg, item) in enumerate(zip(args, data, strict=True))
        )
    if origin is dict:
        key_type, value_type = get_args(annotation)
        if not isinstance(data, dict):
            raise DecodeError(path, f"expected an object, got {abridged(data)}")
        return {
            _decode(key_type, k, path, text): _decode(value_type, v, f"{path}.{printable(str(k))}", text)
            for k, v in data.items()
        }
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(data)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in annotation)
            raise DecodeError(path, f"expected one of {choices}, got {abridged(data)}") from None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _decode_dataclass(annotation, data, path, text)
    return _decode_scalar(annotation, data, path, text)


def _decode_scalar(annotation: Any, data: Any, path: str, text: Text) -> Any:
    if annotation is bool:
        if isinstance(data, bool):
            return data
        raise DecodeError(path, f"expected true or false, got {abridged(data)}")
    if annotation is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise DecodeError(path, f"expected an integer, got {abridged(data)}")
    if annotation is float:
        try:
            if isinstance(data, int | float) and not isinstance(data, bool) and math.isfinite(data):
                return float(data)
        except OverflowError:  # an integer beyond any float
            pass
        raise DecodeError(path, f"expected a finite number, got {abridged(data)}")
    if annotation is str:
        if isinstance(data, str):
            return text(data)
        raise DecodeError(path, f"expected a string, got {abridged(data)}")
    raise DecodeError(path, f"cannot decode a {annotation!r}")


def _decode_dataclass(cls: type, data: Any, path: str, text: Text) -> Any:
    if not isinstance(data, dict):
        raise DecodeError(path, f"expected an object, got {abridged(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    # Fields of earlier releases a type no longer has (its DROPPED): the run history still holds them.
    unknown = sorted(set(data) - set(fields) - getattr(cls, "DROPPED", frozenset()))
    if unknown:
        raise DecodeError(path, f"unknown field {unknown[0]!r}")
    values = {}
    for name, field in fields.items():
        where = f"{path}.{name}" if path else name
        if name in data:
            values[name] = _decode(hints[name], data[name], where, text)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise DecodeError(where, "missing")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # a constraint the type itself checks
        raise DecodeError(path, str(exc)) from None
