"""A disaggregated pool's configuration: roles, bootstrap ports, the quick-start flags, the pool's split."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from backends.config import pd_backends
from backends.pool import BackendPool
from gateway.cli import app
from gateway.config.schema import load_config


def _config(backends: list[dict[str, object]]) -> dict[str, object]:
    return {"models": {"kimi": {"backends": backends}}}


def test_flags_build_a_disaggregated_pool() -> None:
    entries = pd_backends(["http://10.0.0.5:30000:9001", "http://10.0.0.6:30000"], ["http://10.0.0.7:30000"])
    assert entries == [
        {"url": "http://10.0.0.5:30000", "role": "prefill", "bootstrap_port": 9001},
        {"url": "http://10.0.0.6:30000", "role": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.0.0.7:30000", "role": "decode"},
    ]
    cfg = load_config(None, backends=entries, model="kimi")
    model = cfg.models["kimi"]
    assert model.disaggregated
    assert [(b.role, b.bootstrap_port) for b in model.backends] == [
        ("prefill", 9001),
        ("prefill", 8998),
        ("decode", None),
    ]
    pool = BackendPool(cfg, polled=False)
    assert [v.name for v in pool.views("kimi")] == ["10.0.0.7:30000"]  # the core routes over decode only
    assert [b.name for b in pool.prefills("kimi")] == ["10.0.0.5:30000", "10.0.0.6:30000"]


@pytest.mark.parametrize(
    ("backends", "message"),
    [
        ([{"url": "http://a:1", "role": "prefill"}, {"url": "http://b:1", "role": "decode"}], "needs bootstrap_port"),
        ([{"url": "http://a:1", "role": "prefill", "bootstrap_port": 8998}], "needs decode backends"),
        ([{"url": "http://b:1", "role": "decode"}], "needs prefill backends"),
        ([{"url": "http://b:1", "role": "decode", "bootstrap_port": 8998}], "for role: prefill backends only"),
        (
            [
                {"url": "http://a:1", "role": "prefill", "bootstrap_port": 1},
                {"url": "http://b:1", "role": "decode"},
                {"url": "http://c:1"},
            ],
            "each need role",
        ),
        ([{"url": "http://a:1", "role": "both"}], "role"),
    ],
)
def test_invalid_pools_are_refused_with_a_clear_error(
    backends: list[dict[str, object]], message: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(backends)))
    with pytest.raises(ValueError, match=message):
        load_config(path)


def test_serve_flags_refuse_a_pool_without_decode() -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "kimi", "--prefill", "http://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "needs decode backends" in result.output
