"""Config sections generated from a policy's own parameters (gateway/config/params.py): which
parameters are configurable, the strict optional model made of them with the bounds a file must
respect, and the error that names the field. The real sections (``admission:``, ``router:``,
``breaker:``) against their policies: tests/gateway/test_config_sections.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from gateway.config.params import check_section, parameters, section_model


@dataclass(frozen=True)
class Params:
    ratio: float = 0.5
    count: int = 3
    name: str = "x"
    on: bool = True
    maybe: int | None = None  # not a scalar type: not configurable
    items: list[int] = field(default_factory=list)


class Policy:
    def __init__(self, backends: list[str], first: int, *, gain: float = 1.5, label: str = "p", cap: int | None = None):
        self.gain = gain


def test_a_dataclass_offers_its_scalar_fields_with_their_defaults() -> None:
    assert parameters(Params) == {
        "ratio": (float, 0.5),
        "count": (int, 3),
        "name": (str, "x"),
        "on": (bool, True),
    }


def test_a_class_offers_its_scalar_keyword_parameters() -> None:
    """Parameters without a default (what the caller must give) and of other types are not configurable."""
    assert parameters(Policy) == {"gain": (float, 1.5), "label": (str, "p")}


def test_a_section_is_strict_and_every_field_optional() -> None:
    model = section_model(Params, "ParamsSection", {"ratio": {"gt": 0, "le": 1}, "count": {"ge": 1}})
    assert model.__name__ == "ParamsSection"
    assert set(model.model_fields) == {"ratio", "count", "name", "on"}
    assert model().model_dump() == {"ratio": None, "count": None, "name": None, "on": None}, "unset: the policy's"
    assert model.model_fields["ratio"].description == "default 0.5"
    assert model.model_validate({"ratio": 1, "count": 7}).model_dump(exclude_none=True) == {"ratio": 1.0, "count": 7}
    for bad in ({"ratio": 0}, {"ratio": 1.5}, {"count": 0}, {"unknown": 1}, {"maybe": 1}, {"count": "many"}):
        with pytest.raises(ValidationError):
            model.model_validate(bad)


def test_bounds_may_be_any_field_constraint() -> None:
    model = section_model(Params, "Named", {"name": {"pattern": "^(a|b)$"}})
    assert model.model_validate({"name": "a"}).model_dump(exclude_none=True) == {"name": "a"}
    with pytest.raises(ValidationError):
        model.model_validate({"name": "c"})
    assert model.model_validate({"ratio": 7.0}).model_dump(exclude_none=True) == {"ratio": 7.0}, "unbounded"


def test_check_section_keeps_only_what_is_set() -> None:
    model = section_model(Policy, "PolicySection", {"gain": {"gt": 0}})
    assert check_section(model, None) == {}
    assert check_section(model, {}) == {}
    assert check_section(model, {"gain": 2, "label": None}) == {"gain": 2.0}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"gain": -1}, r"^gain: Input should be greater than 0 \(known: gain, label\)$"),
        ({"gian": 2}, r"^gian: Extra inputs are not permitted \(known: gain, label\)$"),
        ({"label": 5}, r"^label: Input should be a valid string \(known: gain, label\)$"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_field_and_the_known_ones(value: dict, message: str) -> None:
    model = section_model(Policy, "PolicySection", {"gain": {"gt": 0}})
    with pytest.raises(ValueError, match=message) as info:
        check_section(model, value)
    assert not isinstance(info.value, ValidationError), "a plain ValueError: pydantic wraps it in the config's own"
