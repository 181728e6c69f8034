"""Real coding clients, installed once into a cache and run non-interactively against a base URL.

    from tests.live.clients import run_claude, run_codex, run_aider

    result = run_codex("http://127.0.0.1:8080", "What is in this project?", root=tmp_path)
    assert result.exit_code == 0, result.stderr

Installs (each pinned, reused between runs, safe to call from parallel test processes):

- Codex CLI ``@openai/codex`` and Claude Code ``@anthropic-ai/claude-code`` with ``npm install``
  into ``CACHE_DIR/<name>@<version>``;
- aider ``aider-chat`` into its own virtualenv there (its pins conflict with this project's);
- opencode ``opencode-ai`` and Continue's CLI ``@continuedev/cli`` with npm, like the first two.

``CACHE_DIR`` is ``$CACHEGATE_CLIENTS_DIR`` or ``~/.cache/cachegate-clients``. An install is done
under a file lock, in a temporary directory renamed into place, and marked done by a file that
records the version, so an interrupted install is redone, not trusted. When the registry cannot
be reached, :class:`ClientUnavailable` says so (with the registry URL and npm's or pip's message).

Every run gets a scratch ``HOME`` (and ``CODEX_HOME``) and working directory under ``root`` with a
``README.md`` in it, a minimal environment (nothing of the caller's ``OPENAI_*``/``ANTHROPIC_*``),
the settings that keep each client on loopback (``docs/clients.md``), stdin closed and a bounded
timeout after which the client's whole process group is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_DIR = Path(os.environ.get("CACHEGATE_CLIENTS_DIR") or Path.home() / ".cache" / "cachegate-clients")
INSTALL_TIMEOUT_S = 900.0
README = "# demo\n\nA small demo project used by cachegate's client tests.\n"


@dataclass(frozen=True)
class Package:
    """One client: where it comes from and which executable it provides."""

    registry: str  # "npm" or "pypi"
    name: str
    version: str
    executable: str
    slug: str

    @property
    def home(self) -> Path:
        return CACHE_DIR / f"{self.slug}@{self.version}"

    @property
    def binary(self) -> Path:
        if self.registry == "npm":
            return self.home / "node_modules" / ".bin" / self.executable
        return self.home / "bin" / self.executable


CODEX = Package("npm", "@openai/codex", "0.171.0", "codex", "openai-codex")
CLAUDE_CODE = Package("npm", "@anthropic-ai/claude-code", "2.1.197", "claude", "claude-code")
AIDER = Package("pypi", "aider-chat", "0.86.2", "aider", "aider-chat")
OPENCODE = Package("npm", "opencode-ai", "1.18.33", "opencode", "opencode")
CONTINUE = Package("npm", "@continuedev/cli", "1.5.47", "cn", "continue-cli")


class ClientUnavailable(RuntimeError):
    """A client could not be installed (registry unreachable, npm missing...)."""


@dataclass
class ClientResult:
    client: str
    argv: list[str]
    exit_code: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    duration_s: float
    workdir: Path
    json: Any = None  # Claude Code: the result object; Codex: the list of JSONL events
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    def describe(self) -> str:
        """A failure message with what the client said."""
        return (
            f"{self.client} exit={self.exit_code} after {self.duration_s:.1f}s\n"
            f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"
        )


# ---- installing ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _marker(pkg: Package) -> Path:
    return pkg.home / ".cachegate-installed"


def _installed(pkg: Package) -> bool:
    marker = _marker(pkg)
    return marker.is_file() and marker.read_text().strip() == f"{pkg.name}@{pkg.version}" and pkg.binary.exists()


def install(pkg: Package) -> Path:
    """The client's executable, installing it into the cache first if needed."""
    if _installed(pkg):
        return pkg.binary
    with _lock(pkg.slug):
        if _installed(pkg):
            return pkg.binary
        if _reports_version(pkg):  # a complete tree without our marker (installed by hand): adopt it
            _marker(pkg).write_text(f"{pkg.name}@{pkg.version}\n")
            return pkg.binary
        if pkg.home.exists():  # an interrupted install: redo it
            shutil.rmtree(pkg.home)
        if pkg.registry == "npm":
            _npm_install(pkg)
        else:
            _venv_install(pkg)
        if not pkg.binary.exists():
            raise ClientUnavailable(f"{pkg.name}@{pkg.version} installed but {pkg.binary} is missing")
        _marker(pkg).write_text(f"{pkg.name}@{pkg.version}\n")
    return pkg.binary


def _reports_version(pkg: Package) -> bool:
    if not pkg.binary.exists():
        return False
    try:
        done = subprocess.run([str(pkg.binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and pkg.version in done.stdout + done.stderr


def _run_install(argv: list[str], what: str, registry: str, cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise ClientUnavailable(f"installing {what} from {registry} took over {INSTALL_TIMEOUT_S:.0f}s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-1500:]
        raise ClientUnavailable(
            f"could not install {what} from {registry} (exit {done.returncode}); the real-client tests need that "
            f"registry, or a warm cache in {CACHE_DIR}. Last output:\n{tail}"
        )


def _npm_install(pkg: Package) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise ClientUnavailable(f"npm is not installed: cannot install {pkg.name} (install Node.js >= 18)")
    registry = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True).stdout.strip()
    tmp = pkg.home.with_name(pkg.home.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        argv = [npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--no-save", "--loglevel=error",
                f"{pkg.name}@{pkg.version}"]  # fmt: skip
        _run_install(argv, f"{pkg.name}@{pkg.version}", registry or "the npm registry")
        tmp.rename(pkg.home)  # npm's .bin links are relative: the tree can move
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _venv_install(pkg: Package) -> None:
    # A virtualenv cannot be moved, so it is built in place; the marker is written only at the end.
    try:
        _run_install([sys.executable, "-m", "venv", str(pkg.home)], f"a virtualenv for {pkg.name}", "venv")
        pip = [str(pkg.home / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run_install([*pip, f"{pkg.name}=={pkg.version}"], f"{pkg.name}=={pkg.version}", "PyPI")
    except ClientUnavailable:
        shutil.rmtree(pkg.home, ignore_errors=True)
        raise


# ---- running ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    home: Path
    workdir: Path


def scratch(root: Path, name: str) -> Scratch:
    """A scratch ``HOME`` and working directory (with ``README.md``) under ``root``."""
    home, work = root / f"{name}-home", root / f"{name}-work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "README.md").write_text(README)
    return Scratch(home, work)


def _base_env(home: Path) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TERM": "dumb",
           "NO_COLOR": "1"}  # fmt: skip
    node = shutil.which("node")
    if node:
        env["PATH"] = f"{Path(node).parent}:{env['PATH']}"
    return env


def _run(client: str, argv: list[str], env: dict[str, str], workdir: Path, timeout_s: float) -> ClientResult:
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the client and anything it started
        out, err = proc.communicate()
        code = None
    return ClientResult(client, argv, code, out, err, time.monotonic() - start, workdir, env=env)


def codex_config(base_url: str, model: str, key_env: str = "CG_KEY") -> str:
    """Codex CLI's ``config.toml`` for a cachegate (or twin) at ``base_url`` (no ``/v1``)."""
    return f"""model = "{model}"
model_provider = "cachegate"
check_for_update_on_startup = false
model_context_window = 262144

[model_providers.cachegate]
name = "cachegate"
base_url = "{base_url.rstrip("/")}/v1"
env_key = "{key_env}"
wire_api = "responses"

[analytics]
enabled = false
"""


def run_codex(
    base_url: str, prompt: str, *, root: Path, model: str = "kimi", api_key: str = "cachegate-test",
    timeout_s: float = 180.0,
) -> ClientResult:  # fmt: skip
    """``codex exec --json`` in a read-only sandbox; ``json`` is the list of its JSONL events."""
    binary = install(CODEX)
    s = scratch(root, "codex")
    codex_home = s.home / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model))
    env = {**_base_env(s.home), "CODEX_HOME": str(codex_home), "CG_KEY": api_key}
    argv = [str(binary), "exec", "--skip-git-repo-check", "-s", "read-only", "--json", prompt]
    result = _run("codex", argv, env, s.workdir, timeout_s)
    events = []
    for line in result.stdout.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    result.json = events
    return result


def run_claude(
    base_url: str, prompt: str, *, root: Path, model: str = "kimi", small_model: str | None = None,
    api_key: str = "cachegate-test", timeout_s: float = 180.0,
) -> ClientResult:  # fmt: skip
    """``claude -p PROMPT --output-format json``; ``json`` is its result object (``is_error``,
    ``num_turns``, ``usage``...). The key goes in ``ANTHROPIC_AUTH_TOKEN`` (a Bearer header)."""
    binary = install(CLAUDE_CODE)
    s = scratch(root, "claude")
    env = {
        **_base_env(s.home),
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": api_key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": small_model or model,  # background calls (titles, summaries)
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    argv = [str(binary), "-p", prompt, "--output-format", "json"]
    result = _run("claude", argv, env, s.workdir, timeout_s)
    with contextlib.suppress(json.JSONDecodeError):
        result.json = json.loads(result.stdout)
    return result


def aider_model_metadata(model: str, context: int = 262144, output: int = 32768) -> dict[str, Any]:
    """aider's ``--model-metadata-file`` entry, so it knows the context window."""
    return {f"openai/{model}": {"max_input_tokens": context, "max_output_tokens": output, "max_tokens": output,
                                "input_cost_per_token": 0, "output_cost_per_token": 0,
                                "litellm_provider": "openai", "mode": "chat"}}  # fmt: skip


def run_aider(
    base_url: str, prompt: str, *, root: Path, model: str = "kimi", api_key: str = "cachegate-test",
    timeout_s: float = 180.0,
) -> ClientResult:  # fmt: skip
    """aider one-shot (``--message``) on ``README.md``, no git, no network beyond ``base_url``."""
    binary = install(AIDER)
    s = scratch(root, "aider")
    meta = s.home / "model-metadata.json"
    meta.write_text(json.dumps(aider_model_metadata(model)))
    env = {**_base_env(s.home), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_ANALYTICS": "false"}
    argv = [str(binary), "--model", f"openai/{model}", "--openai-api-base", f"{base_url.rstrip('/')}/v1",
            "--openai-api-key", api_key, "--model-metadata-file", str(meta), "--no-git", "--no-analytics",
            "--no-check-update", "--no-show-model-warnings", "--yes-always", "--no-pretty",
            "--message", prompt, "README.md"]  # fmt: skip
    return _run("aider", argv, env, s.workdir, timeout_s)


def opencode_config(base_url: str, model: str, api_key: str) -> dict[str, Any]:
    """``opencode.json``: an OpenAI-compatible provider with Kimi's limits (``limit.output`` caps the
    ``max_tokens`` opencode asks for, 32,000 by default)."""
    limit = {"context": 262144, "output": 32768}
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "cachegate",
                "options": {"baseURL": f"{base_url.rstrip('/')}/v1", "apiKey": api_key},
                "models": {model: {"name": f"{model} via cachegate", "limit": limit}}}  # fmt: skip
    return {"$schema": "https://opencode.ai/config.json", "provider": {"cachegate": provider},
            "model": f"cachegate/{model}", "autoupdate": False, "share": "disabled"}  # fmt: skip


def run_opencode(
    base_url: str, prompt: str, *, root: Path, model: str = "kimi", api_key: str = "cachegate-test",
    timeout_s: float = 180.0,
) -> ClientResult:  # fmt: skip
    """``opencode run``. opencode installs its provider package (``@ai-sdk/openai-compatible``) from
    npm on first use; its cache is kept under ``CACHE_DIR`` so later runs do not fetch it again."""
    binary = install(OPENCODE)
    s = scratch(root, "opencode")
    (s.workdir / "opencode.json").write_text(json.dumps(opencode_config(base_url, model, api_key)))
    env = {**_base_env(s.home), "XDG_CACHE_HOME": str(CACHE_DIR / "opencode-runtime"),
           "npm_config_cache": str(CACHE_DIR / "npm-cache"), "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_MODELS_FETCH": "1"}  # fmt: skip
    argv = [str(binary), "run", "-m", f"cachegate/{model}", prompt]
    return _run("opencode", argv, env, s.workdir, timeout_s)


def continue_config(base_url: str, model: str, api_key: str) -> str:
    """Continue's ``config.yaml`` (``provider: openai``) with Kimi's context window."""
    return f"""name: cachegate
version: 1.0.0
schema: v1
models:
  - name: {model}
    provider: openai
    model: {model}
    apiBase: {base_url.rstrip("/")}/v1
    apiKey: {api_key}
    roles: [chat, edit, apply]
    capabilities: [tool_use]
    defaultCompletionOptions:
      contextLength: 262144
      maxTokens: 8192
"""


def run_continue(
    base_url: str, prompt: str, *, root: Path, model: str = "kimi", api_key: str = "cachegate-test",
    timeout_s: float = 180.0,
) -> ClientResult:  # fmt: skip
    """Continue's CLI headless: ``cn -p --config config.yaml PROMPT``."""
    binary = install(CONTINUE)
    s = scratch(root, "continue")
    config = s.home / "config.yaml"
    config.write_text(continue_config(base_url, model, api_key))
    env = {**_base_env(s.home), "CONTINUE_TELEMETRY_ENABLED": "0"}
    return _run("continue", [str(binary), "-p", "--config", str(config), prompt], env, s.workdir, timeout_s)
