"""gateway/request/auth.py: API keys → teams (``KeyStore``), the keys a request presents
(``presented_keys``) and the admin token check (``check_token``)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from gateway.config.schema import load_config
from gateway.http.errors import GatewayError
from gateway.request.auth import KeyStore, check_token, presented_keys


def store(*keys: str) -> KeyStore:
    return KeyStore(load_config(backends=["http://a:1"], model="m", api_keys=list(keys) or None))


def raw(*pairs: tuple[str, str]) -> Headers:
    """Headers as a server hands them over: repeated names kept, values as UTF-8 bytes on the wire."""
    return Headers(raw=[(k.encode(), v.encode()) for k, v in pairs])


# ----- presented_keys ------------------------------------------------------------------------------


def test_presented_keys_come_in_header_order_bearer_or_bare() -> None:
    headers = raw(("api-key", "az"), ("x-api-key", "anth"), ("authorization", "Bearer  tok "))
    assert presented_keys(headers) == ["tok", "anth", "az"]
    assert presented_keys(raw(("authorization", "bare-key"))) == ["bare-key"]
    assert presented_keys(raw(("authorization", "bEaReR mixed"))) == ["mixed"]


def test_presented_keys_skip_basic_auth_and_empty_values() -> None:
    headers = raw(
        ("authorization", "Basic c2VjcmV0"),
        ("authorization", "Bearer "),
        ("authorization", "   "),
        ("x-api-key", ""),
        ("x-api-key", "  "),
        ("api-key", "real"),
    )
    assert presented_keys(headers) == ["real"]
    assert presented_keys(Headers({})) == []


def test_repeated_headers_count_once_each_and_at_most_eight_are_tried() -> None:
    headers = raw(*(("x-api-key", f"k{i}") for i in range(12)), ("authorization", "Bearer first"))
    keys = presented_keys(headers)
    assert len(keys) == 8 and keys[0] == "first" and keys[1:] == [f"k{i}" for i in range(7)]


# ----- KeyStore ------------------------------------------------------------------------------------


def test_without_keys_the_store_is_open_and_every_caller_is_team_default() -> None:
    open_store = store()
    assert open_store.open
    assert open_store.team_for(Headers({})) == "default"
    assert open_store.team_for(raw(("authorization", "Bearer anything"))) == "default"
    assert not store("k").open


@pytest.mark.parametrize("header", ["authorization", "x-api-key", "api-key"])
def test_a_key_in_any_of_the_three_headers_gives_its_team(header: str) -> None:
    value = "Bearer sk-plat" if header == "authorization" else "sk-plat"
    assert store("sk-plat=platform", "sk-other=other").team_for(raw((header, value))) == "platform"


def test_a_key_without_a_team_belongs_to_default() -> None:
    assert store("sk-a").team_for(raw(("x-api-key", "sk-a"))) == "default"


def test_a_missing_key_and_a_wrong_key_are_told_apart() -> None:
    keys = store("sk-a=a")
    with pytest.raises(GatewayError) as missing:
        keys.team_for(raw(("authorization", "Basic c2stYQ=="), ("x-api-key", " ")))
    assert (missing.value.status, missing.value.code) == (401, "missing_api_key")
    with pytest.raises(GatewayError) as wrong:
        keys.team_for(raw(("authorization", "Bearer sk-b")))
    assert (wrong.value.status, wrong.value.code) == (401, "invalid_api_key")
    with pytest.raises(GatewayError):
        keys.team_for(raw(("authorization", "Bearer SK-A")))  # keys are case-sensitive


def test_a_malformed_or_wrong_header_never_hides_a_valid_key_in_another() -> None:
    keys = store("sk-a=a")
    headers = raw(("authorization", "Bearer wrong"), ("x-api-key", "garbage"), ("api-key", "sk-a"))
    assert keys.team_for(headers) == "a"


def test_the_first_matching_key_gives_the_team() -> None:
    keys = store("sk-a=a", "sk-b=b")
    assert keys.team_for(raw(("authorization", "Bearer sk-b"), ("x-api-key", "sk-a"))) == "b"
    assert keys.team_for(raw(("authorization", "Bearer sk-a"), ("x-api-key", "sk-b"))) == "a"


def test_a_valid_key_past_the_eighth_is_not_tried() -> None:
    headers = raw(*(("x-api-key", f"junk{i}") for i in range(8)), ("api-key", "sk-a"))
    with pytest.raises(GatewayError) as info:
        store("sk-a=a").team_for(headers)
    assert info.value.code == "invalid_api_key"


def test_a_key_with_bytes_that_are_not_utf8_is_refused_not_crashed_on() -> None:
    headers = Headers(raw=[(b"x-api-key", b"\xff\xfe-key")])
    with pytest.raises(GatewayError) as info:
        store("sk-a=a").team_for(headers)
    assert info.value.status == 401


def test_a_non_ascii_key_sent_as_utf8_matches_its_configured_digest() -> None:
    assert store("clé-secrète=t").team_for(raw(("authorization", "Bearer clé-secrète"))) == "t"
    with pytest.raises(GatewayError):  # the same characters sent as latin-1 bytes are another key
        store("clé-secrète=t").team_for(Headers(raw=[(b"x-api-key", "clé-secrète".encode("latin-1"))]))
    assert check_token(raw(("x-api-key", "jeton-é"))["x-api-key"], "jeton-é"), "the admin token too"


def test_allowed_opens_to_the_admin_token_or_a_valid_team_key() -> None:
    keys = store("sk-a=a")
    assert keys.allowed(raw(("authorization", "Bearer adm")), "adm")
    assert keys.allowed(raw(("x-api-key", "adm")), "adm"), "the admin token may come in any key header"
    assert keys.allowed(raw(("x-api-key", "sk-a")), "adm")
    assert keys.allowed(raw(("x-api-key", "sk-a")), None)
    assert not keys.allowed(raw(("x-api-key", "nope")), "adm")
    assert not keys.allowed(Headers({}), "adm")


def test_allowed_on_an_open_store_needs_the_admin_token() -> None:
    open_store = store()
    assert not open_store.allowed(raw(("authorization", "Bearer anything")), "adm")
    assert not open_store.allowed(raw(("authorization", "Bearer anything")), None)
    assert open_store.allowed(raw(("authorization", "Bearer adm")), "adm")


# ----- check_token ---------------------------------------------------------------------------------


def test_check_token_needs_both_sides_and_an_exact_match() -> None:
    assert check_token("t0ken", "t0ken")
    assert not check_token("t0ken ", "t0ken")
    assert not check_token("t0ke", "t0ken")
    assert not check_token("", "")
    assert not check_token("", "t0ken") and not check_token("t0ken", "")
    assert not check_token(None, "t0ken") and not check_token("t0ken", None)
    assert check_token("é".encode().decode("latin-1"), "é"), "as a server decodes it off the wire"
    assert not check_token("é", "é"), "a latin-1 é on the wire is not the UTF-8 token"
