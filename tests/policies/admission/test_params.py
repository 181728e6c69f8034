"""policies/admission/params.py: ``SeatParams`` declares each seat parameter once; its docstring (and
the package's) states each default, and the config's ``admission:`` section is generated from its
fields, so a default changed in one place and not the other is caught here."""

from __future__ import annotations

import dataclasses
import re

import pytest

import policies.admission as admission_package
from policies.admission.params import SeatParams

FIELDS = {f.name: f.default for f in dataclasses.fields(SeatParams)}
_VALUE = re.compile(r"``(\w+)`` (\"\w+\"|\d[\d.]*|off|on)")


def _stated(doc: str, marker: str) -> dict[str, object]:
    """The first value stated for each parameter after ``marker`` (``name`` value)."""
    out: dict[str, object] = {}
    for name, value in _VALUE.findall(doc[doc.index(marker) :]):
        if name in out:
            continue
        if value.startswith('"'):
            out[name] = value.strip('"')
        elif value in ("off", "on"):
            out[name] = value == "on"
        else:
            out[name] = float(value)
    return out


def _mismatches(stated: dict[str, object]) -> dict[str, tuple[object, object]]:
    return {
        name: (stated[name], default)
        for name, default in FIELDS.items()
        if name in stated
        and (stated[name] != default if isinstance(default, str | bool) else float(stated[name]) != default)  # type: ignore[arg-type]
    }


def test_the_class_docstring_states_every_default_as_declared() -> None:
    stated = _stated(SeatParams.__doc__ or "", "Defaults:")
    assert set(FIELDS) <= set(stated), f"defaults not stated: {sorted(set(FIELDS) - set(stated))}"
    assert _mismatches(stated) == {}


def test_the_package_docstring_states_the_same_defaults() -> None:
    stated = _stated(admission_package.__doc__ or "", "Parameters and defaults:")
    numeric = {n for n, d in FIELDS.items() if not isinstance(d, bool)}
    assert numeric <= set(stated), f"defaults not stated: {sorted(numeric - set(stated))}"
    assert _mismatches(stated) == {}


def test_the_marks_are_ordered_and_the_fields_are_scalars() -> None:
    p = SeatParams()
    assert 0 < p.admit_water <= p.high_water <= p.kv_overbook
    assert p.min_hold_s <= p.quantum_s and p.cap_patience_s <= p.cap_queue_s <= p.wait_lead_s
    assert p.rotate_on in ("waiter", "seat") and p.rotate_by in ("lend", "evict")
    assert all(isinstance(v, int | float | str | bool) for v in FIELDS.values())  # the config can set each


def test_params_are_frozen_and_refuse_unknown_names() -> None:
    p = SeatParams(quantum_s=60.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.quantum_s = 30.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        SeatParams(quantum=60.0)  # type: ignore[call-arg]
    assert dataclasses.replace(p, min_hold_s=5.0) == SeatParams(quantum_s=60.0, min_hold_s=5.0)
