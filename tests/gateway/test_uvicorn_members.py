"""``gateway/http/server.py`` builds on members of uvicorn's ``HttpToolsProtocol`` and
``RequestResponseCycle`` that are not public API. This reads both sources and fails, naming each
member, when the installed uvicorn no longer has one the gateway's protocol uses; ``pyproject.toml``
pins uvicorn to the versions checked this way."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ROOT / "gateway" / "http" / "server.py"


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class provides: its methods, class attributes and every ``self.X = ...`` of its methods."""
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    found.add(sub.attr)
    return found


def uses(source: str) -> tuple[set[str], set[str]]:
    """What our protocol takes from uvicorn: members of the protocol (``self.X`` it does not define,
    ``super().X``) and of the request cycle (``cycle.X``, ``self.cycle.X``)."""
    cls = _class(ast.parse(source), "LimitedHttpToolsProtocol")
    own = _members(cls)
    protocol: set[str] = set()
    cycle: set[str] = set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        own_attr = isinstance(base, ast.Name) and base.id == "self" and node.attr in own
        is_self = isinstance(base, ast.Name) and base.id == "self"
        is_super = isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
        if (is_self and not own_attr) or is_super:
            protocol.add(node.attr)
        elif (isinstance(base, ast.Name) and base.id == "cycle") or (
            isinstance(base, ast.Attribute) and base.attr == "cycle"
        ):
            cycle.add(node.attr)
    return protocol, cycle


def missing(ours: str, uvicorn_source: str) -> list[str]:
    """The members ``ours`` uses that ``uvicorn_source`` (httptools_impl.py) does not provide."""
    tree = ast.parse(uvicorn_source)
    protocol, cycle = uses(ours)
    has_protocol = _members(_class(tree, "HttpToolsProtocol"))
    has_cycle = _members(_class(tree, "RequestResponseCycle"))
    return sorted(
        [f"HttpToolsProtocol.{m}" for m in protocol - has_protocol]
        + [f"RequestResponseCycle.{m}" for m in cycle - has_cycle]
    )


def _installed() -> str:
    spec = importlib.util.find_spec("uvicorn.protocols.http.httptools_impl")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text()


def test_the_installed_uvicorn_has_every_member_the_gateway_protocol_uses() -> None:
    import uvicorn

    gone = missing(OURS.read_text(), _installed())
    assert not gone, f"uvicorn {uvicorn.__version__} moved what gateway/http/server.py relies on: {gone}"


def test_the_check_sees_the_members_and_a_moved_one() -> None:
    protocol, cycle = uses(OURS.read_text())
    assert {"pipeline", "server_state", "_unset_keepalive_if_required", "connection_lost"} <= protocol
    assert {"response_started", "response_complete", "chunked_encoding", "keep_alive", "message_event"} <= cycle
    moved = _installed().replace("self.message_event", "self.message_ready")
    assert "RequestResponseCycle.message_event" in missing(OURS.read_text(), moved)


def test_the_names_imported_from_uvicorn_are_there() -> None:
    from uvicorn.protocols.http import httptools_impl

    for name in ("HEADER_RE", "HEADER_VALUE_RE", "STATUS_LINE", "HttpToolsProtocol", "RequestResponseCycle"):
        assert hasattr(httptools_impl, name), name
