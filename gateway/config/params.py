"""Configuration sections generated from the policy they configure, so each parameter is declared
once: its name, type and default in the policy (a dataclass's fields, or a class's keyword
parameters), its meaning in the policy's docstring. Here only the bounds a config file must respect.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

_SCALARS = (int, float, str, bool)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def parameters(target: Callable[..., object]) -> dict[str, tuple[Any, Any]]:
    """``{name: (type, default)}`` of ``target``'s scalar parameters: a dataclass's fields, or the
    keyword parameters of a class's ``__init__`` (parameters of other types are not configurable)."""
    init = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    hints = typing.get_type_hints(target if dataclasses.is_dataclass(target) else init)
    out: dict[str, tuple[Any, Any]] = {}
    if dataclasses.is_dataclass(target):
        pairs = [(f.name, f.default) for f in dataclasses.fields(target)]
    else:
        pairs = [
            (p.name, p.default)
            for p in inspect.signature(init).parameters.values()
            if p.name != "self" and p.default is not inspect.Parameter.empty
        ]
    for name, default in pairs:
        kind = hints.get(name)
        if kind in _SCALARS:
            out[name] = (kind, default)
    return out


def section_model(
    target: Callable[..., object], name: str, bounds: Mapping[str, Mapping[str, Any]] | None = None
) -> type[BaseModel]:
    """A strict model of ``target``'s parameters, each optional (None: the policy's own default)."""
    fields: dict[str, Any] = {
        key: (kind | None, Field(None, description=f"default {default!r}", **dict((bounds or {}).get(key, {}))))
        for key, (kind, default) in parameters(target).items()
    }
    model: type[BaseModel] = create_model(name, __base__=_Section, **fields)
    return model


def check_section(model: type[BaseModel], value: Mapping[str, Any] | None) -> dict[str, Any]:
    """``value`` validated by ``model``, without the unset entries; a ValueError naming the field."""
    try:
        return model.model_validate(dict(value or {})).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        known = ", ".join(sorted(model.model_fields))
        raise ValueError(f"{where}: {first['msg']} (known: {known})") from None
