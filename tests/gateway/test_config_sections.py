"""Each concept is defined once: team limits, seat, router and breaker parameters, refusal codes."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

from gateway.config.params import parameters
from gateway.config.schema import AdmissionSection, BreakerSection, Config, RouterSection, TeamConfig
from gateway.observability.metrics import REFUSAL_REASONS
from policies import registry
from policies.admission import SeatedAdmission, SeatParams
from policies.breaker import Breaker
from policies.routers.min_ttft import MinTTFT
from policies.teams import TeamLimits
from policies.types import RefusalCode


def test_team_config_has_exactly_the_fields_and_defaults_of_team_limits() -> None:
    assert TeamConfig().limits() == TeamLimits()
    assert set(TeamConfig.model_fields) == {f.name for f in dataclasses.fields(TeamLimits)}


def test_each_config_section_offers_every_scalar_parameter_of_its_policy() -> None:
    assert set(AdmissionSection.model_fields) == {f.name for f in dataclasses.fields(SeatParams)}
    assert set(RouterSection.model_fields) == set(parameters(MinTTFT)) >= {"tie_rel", "load_factor", "seed"}
    assert set(BreakerSection.model_fields) == {
        "consecutive_failures",
        "error_rate",
        "window",
        "min_samples",
        "open_s",
        "max_open_s",
    }


def test_refusal_metric_labels_are_the_refusal_codes() -> None:
    assert get_args(RefusalCode) == REFUSAL_REASONS


def test_router_and_breaker_parameters_reach_the_policies() -> None:
    config = Config.model_validate(
        {"router": {"tie_rel": 0.3, "load_factor": 2.0}, "breaker": {"open_s": 7.5}, "admission": {"quantum_s": 120}}
    )
    core = registry.build(config.policy, router_params=config.router)
    core.configure({"admission": config.admission})
    assert isinstance(core, SeatedAdmission) and isinstance(core.router, MinTTFT)
    assert (core.router.tie_rel, core.router.load_factor) == (0.3, 2.0)
    assert core.params.quantum_s == 120 and core.params.high_water == SeatParams().high_water
    assert Breaker(**config.breaker).base_open_s == 7.5


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("router", {"tie_rel": -1}, "tie_rel"),
        ("router", {"no_such": 1}, "no_such"),
        ("breaker", {"error_rate": 2}, "error_rate"),
        ("admission", {"rotate_on": "never"}, "rotate_on"),
    ],
)
def test_a_bad_policy_parameter_is_refused_with_its_name(section: str, value: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"{section}\n.*\b{field}: "):
        Config.model_validate({section: value})


def test_the_example_config_shows_the_policies_own_defaults() -> None:
    from pathlib import Path

    from gateway.config.schema import load_config

    example = load_config(Path(__file__).resolve().parents[2] / "deploy" / "cachegate.example.yaml")
    for section, target in ((example.router, MinTTFT), (example.breaker, Breaker), (example.admission, SeatParams)):
        defaults = {name: default for name, (_, default) in parameters(target).items()}
        assert section and {k: defaults[k] for k in section} == section, target.__name__
