"""Dataclasses <-> JSON objects, for the versioned documents diag writes (analysis, findings).

A document class is a dataclass whose fields carry type hints; ``from_json`` builds it from a decoded JSON
object and ``to_json`` turns it back, the fields in their order: the class is the one definition of its
document, for the code that writes it and the code that reads it. Reading is lenient the way a loader of
older files has to be: a key that is absent, or null where the field is not optional, takes the field's
default; a key the class does not know is kept in ``extra`` (when the class has that field) and written back
unchanged, so a file from a newer writer survives a read-modify-write. Nested dataclasses, ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]`` and ``X | None`` are followed; anything else is taken as it is. Field
metadata: ``key`` (the JSON name, where it is not the field's: ``from``), ``omit_none`` (the key is left out
while the value is None, as for keys only some documents carry).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
EXTRA = "extra"
# Field metadata of a key a document carries only while it is set: field(default=None, metadata=OMIT_NONE).
OMIT_NONE = {"omit_none": True}


Decoder = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _decoder(hint: Any) -> Decoder:
    """A function that decodes one JSON value for this type hint (None passes through)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _decoder(options[0]) if len(options) == 1 else _identity
    if dataclasses.is_dataclass(hint):
        cls = hint
        return lambda v: from_json(cls, v) if isinstance(v, dict) else v  # type: ignore[arg-type]
    if origin in (list, tuple):
        item = _decoder((typing.get_args(hint) or (Any,))[0])
        if item is _identity:
            return lambda v: (list(v) if origin is list else tuple(v)) if isinstance(v, list) else v
        return lambda v: ([item(x) for x in v] if origin is list else tuple(item(x) for x in v)) \
            if isinstance(v, list) else v
    if origin is dict:
        args = typing.get_args(hint)
        item = _decoder(args[1]) if len(args) == 2 else _identity
        if item is _identity:
            return lambda v: dict(v) if isinstance(v, dict) else v
        return lambda v: {k: item(x) for k, x in v.items()} if isinstance(v, dict) else v
    return _identity


_SCALARS = (int, float, str, bool, type(None))


def _encoder(hint: Any) -> Decoder:
    """A function that encodes one field value of this type hint as JSON (None passes through): scalars and
    lists or dicts of scalars as they are (a copy), dataclasses by to_json, anything else walked."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) != 1:
            return _encode
        inner = _encoder(options[0])
        return lambda v: None if v is None else inner(v)
    if hint in _SCALARS:
        return _identity
    if dataclasses.is_dataclass(hint):
        return _encode
    if origin in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis] or [Any]
        item = _encoder(args[0])
        if item is _identity:
            return lambda v: list(v) if isinstance(v, (list, tuple)) else _encode(v)
        return lambda v: [item(x) for x in v] if isinstance(v, (list, tuple)) else _encode(v)
    if origin is dict:
        args = typing.get_args(hint)
        item = _encoder(args[1]) if len(args) == 2 else _encode
        if item is _identity:
            return lambda v: dict(v) if isinstance(v, dict) else _encode(v)
        return lambda v: {k: item(x) for k, x in v.items()} if isinstance(v, dict) else _encode(v)
    return _encode


@dataclasses.dataclass(frozen=True)
class _Slot:
    name: str
    key: str
    decode: Decoder
    encode: Decoder
    optional: bool
    omit_none: bool
    field: dataclasses.Field[Any]


@cache
def _plan(cls: type) -> tuple[tuple[_Slot, ...], bool]:
    """How to read and write each field of cls, computed once per class; and whether cls keeps ``extra``."""
    hints = typing.get_type_hints(cls)
    slots = []
    has_extra = False
    for f in dataclasses.fields(cls):
        if f.name == EXTRA:
            has_extra = True
            continue
        slots.append(_Slot(f.name, str(f.metadata.get("key", f.name)), _decoder(hints[f.name]),
                           _encoder(hints[f.name]), _optional(hints[f.name]), bool(f.metadata.get("omit_none")), f))
    return tuple(slots), has_extra


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a JSON object (see the module docstring for what is lenient)."""
    slots, has_extra = _plan(cls)
    kwargs: dict[str, Any] = {}
    for slot in slots:
        value = data.get(slot.key)
        if value is None:
            kwargs[slot.name] = None if slot.optional else _default(slot.field)
        else:
            kwargs[slot.name] = slot.decode(value)
    if has_extra:
        known = {slot.key for slot in slots}
        kwargs[EXTRA] = {k: v for k, v in data.items() if k not in known}
    return cls(**kwargs)


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def to_json(obj: Any) -> dict[str, Any]:
    """The JSON object of a document dataclass: its fields by key (in field order; an ``omit_none`` field only
    where it is set), then whatever ``extra`` kept."""
    slots, has_extra = _plan(type(obj))
    out = {}
    for slot in slots:
        value = getattr(obj, slot.name)
        if value is None:
            if not slot.omit_none:
                out[slot.key] = None
        else:
            out[slot.key] = slot.encode(value)
    if has_extra:
        out.update(getattr(obj, EXTRA) or {})
    return out


def read_json_object(path: Path) -> dict[str, Any]:
    """A file holding one JSON object; ValueError naming the path otherwise (bad JSON, unreadable, not an object)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def strict_json(value: Any, why: Callable[[str], str], path: str = "") -> tuple[Any, list[dict[str, str]]]:
    """``value`` with every non-finite float (inf, -inf, NaN: not JSON, and jq or a browser reject the
    ``Infinity`` Python writes) replaced by null, and one note per replacement: its path, what it was, and
    ``why(path)`` it is not a number."""
    import math

    notes: list[dict[str, str]] = []

    def walk(item: Any, where: str) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            notes.append({"path": where, "was": "NaN" if item != item else ("Infinity" if item > 0 else "-Infinity"),
                          "why": why(where)})
            return None
        if isinstance(item, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(item)]
        return item

    return walk(value, path), notes


def strict_document(document: dict[str, Any], why: str) -> dict[str, Any]:
    """A JSON object with its non-finite numbers null'ed, listed (path, was, ``why``) under ``nonfinite``."""
    clean, notes = strict_json(document, lambda path: why)
    if notes:
        clean["nonfinite"] = notes
    return clean
