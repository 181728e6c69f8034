"""Workloads: what the simulator and the live client send, seeded and deterministic.

One representation serves both drivers. A request's prompt is a list of **segments** (one chat
message each); a segment is a run of **pieces**, each a ``(text key, tokens)`` pair whose text is
``filler_text(key, tokens)`` (4 bytes a token, see ``backends/sim/tokenizer.py``). The simulator
turns pieces into chained cache blocks (``PromptChain``); the live client renders them as message
text. Equal keys give equal blocks and equal text, which is what makes a resent history hit a
prefix cache in both worlds.

Two workloads here, and the routing family's generated traces in ``loadtest/workloads/`` (``--workload
NAME``: Mooncake-format rows from seeded generators, replayed like ``trace:PATH``):

``coding-agent`` (closed loop, ``CodingAgent``): ``N`` conversation *slots*; each runs one agent
conversation after another. Parameters at ``scale=1``:

* ``PREFIX_TOKENS = 15_000`` system prompt + tool definitions, shared by every conversation of the
  same assistant; ``ASSISTANTS = 3`` assistants (an IDE agent, a CLI agent, a review bot).
* The first prompt is ``U(20k, 60k)`` tokens: the shared prefix plus the user's task with
  repository context.
* Each further turn resends the whole history, the previous answer as generated, and one tool
  result (file contents, diffs, test output). Tool results are log-normal (``sigma = 0.9``, so a
  long tail; capped at ``TOOL_CAP = 40k``) with a mean that falls linearly with the context from
  ``TOOL_EARLY = 6k`` (at <= 40k context) to ``TOOL_LATE = 2.5k`` (at >= 200k): early turns read
  whole files, late turns run tests and read diffs.
* Answers are log-uniform over ``[200, 1500]`` tokens; the client thinks (runs the tool) ``U(2, 8)`` s
  between an answer and its next request.
* A conversation ends when its next prompt would pass ``U(200k, 250k)`` tokens (the model limit
  minus headroom) and the slot starts a new one after a think pause.

  Targets these reproduce (``tests/loadtest/test_workload.py`` checks them): median prompt near 155k tokens
  (the published comparison implies ~162k tokens per request at 48 conversations, §11 of
  ``reference/sglang-and-kimi.md``; its §10 gives the 20-60k start, the 2-5k growth per turn and
  the 200-256k ceiling), and over 95% of all prompt tokens already seen before (sent or generated
  earlier in the same conversation, or a shared prefix).

``trace:PATH`` (open loop, ``TraceWorkload``): the Mooncake format, one JSON object a line with
``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token block,
the last block partial). Block id ``h`` becomes the text ``filler_text("mc/h", n)`` (a prefix of the
same id's full block when partial), so equal ids give equal blocks and equal text. Requests arrive
at ``timestamp / 1000 / speedup`` seconds.

``--scale F`` multiplies every token count (for the ``tiny`` profile and live runs on a laptop);
``--think-scale`` multiplies think times (to match a twin's ``--time-scale``). Teams
(``--teams NAME:N[:KEY],...``) split the slots (closed loop) or the requests (open loop, by weight).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from backends.sim.tokenizer import Block, chain_key, filler_text

BLOCK_TOKENS = 1024
"""Cache block size the simulator uses for coding-agent pieces (eviction granularity)."""
TRACE_BLOCK_TOKENS = 512
"""The Mooncake trace's block size."""

PREFIX_TOKENS = 15_000
ASSISTANTS = 3
START_TOKENS = (20_000, 60_000)
LIMIT_TOKENS = (200_000, 250_000)
TOOL_EARLY = 6_000
TOOL_LATE = 2_500
TOOL_EARLY_AT = 40_000
TOOL_LATE_AT = 200_000
TOOL_SIGMA = 0.9
TOOL_CAP = 40_000
ANSWER_TOKENS = (200, 1_500)
THINK_S = (2.0, 8.0)


@dataclass(frozen=True, slots=True)
class Segment:
    """One chat message: a role and its text as pieces ``(key, tokens)``."""

    role: str
    pieces: tuple[tuple[str, int], ...]

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.pieces)

    def text(self) -> str:
        return "".join(filler_text(key, n) for key, n in self.pieces)


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a conversation: what is appended to the history first, then the answer."""

    new: tuple[Segment, ...]
    output_tokens: int
    think_s: float
    """Pause before sending this turn (after the previous answer, or before the first turn)."""


@dataclass(slots=True)
class Conversation:
    cid: str
    team: str
    slot: int
    turns: list[Turn]

    def answer_segment(self, turn: int) -> Segment:
        """The simulated answer of ``turn`` (the live client uses the text it received instead)."""
        return answer_segment(f"{self.cid}/answer{turn}", self.turns[turn].output_tokens)


def answer_segment(key: str, tokens: int) -> Segment:
    """An answer as pieces: all tokens but the last, then the last one on its own. An engine holds
    no KV for a request's last token (SGLang caches prompt + output - 1), so keeping it in its own
    block lets the cached part of the answer match when the next turn resends it."""
    if tokens <= 1:
        return Segment("assistant", ((key, tokens),))
    return Segment("assistant", ((key, tokens - 1), (f"{key}/last", 1)))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    rid: str
    arrival_s: float
    team: str
    prompt: Segment
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TeamSpec:
    name: str
    conversations: int
    key: str | None = None


def parse_teams(spec: str | None, conversations: int | None = None) -> list[TeamSpec]:
    """``"big:40,small:8:sk-small"`` -> team specs; without a spec, one ``default`` team."""
    if not spec:
        return [TeamSpec("default", conversations or 0)]
    teams: list[TeamSpec] = []
    for item in spec.split(","):
        parts = item.strip().split(":", 2)
        if len(parts) < 2 or not parts[0] or not parts[1].isdigit():
            raise ValueError(f"bad team '{item}': expected NAME:N[:KEY]")
        teams.append(TeamSpec(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else None))
    if len({t.name for t in teams}) != len(teams):
        raise ValueError("team names must be unique")
    return teams


def slot_teams(teams: list[TeamSpec]) -> list[str]:
    """The team of each conversation slot, in order."""
    return [t.name for t in teams for _ in range(t.conversations)]


class PromptChain:
    """A growing prompt as chained cache blocks (what the engine's radix cache and the core's
    fingerprint see). ``extend`` is incremental, so a 50-turn conversation costs O(its tokens)."""

    __slots__ = ("block_tokens", "blocks")

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.blocks: list[Block] = []

    def extend(self, segment: Segment) -> None:
        parent = self.blocks[-1][0] if self.blocks else 0
        for key, n in segment.pieces:
            for i, start in enumerate(range(0, n, self.block_tokens)):
                size = min(self.block_tokens, n - start)
                parent = chain_key(parent, f"{key}#{i}/{size}".encode())
                self.blocks.append((parent, size))

    def copy(self) -> PromptChain:
        other = PromptChain(self.block_tokens)
        other.blocks = list(self.blocks)
        return other

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.blocks)


def _scaled(tokens: float, scale: float) -> int:
    return max(1, round(tokens * scale))


@dataclass
class CodingAgent:
    """Closed-loop coding conversations (module docstring has the parameters and sources)."""

    seed: int = 1
    scale: float = 1.0
    think_scale: float = 1.0
    warm_start: bool = False
    """Enter each slot's first conversation at a random turn, as a deployment that has been running
    for a while would see it: that first request carries the history before the turn (answers as
    ``history`` pieces). Short live runs then measure conversations of every age, not only young
    ones; the caches still start cold."""
    name: str = "coding-agent"
    closed_loop: bool = field(default=True, init=False)

    def prefix_segment(self, assistant: int) -> Segment:
        return Segment("system", ((f"agent{assistant}/system+tools", _scaled(PREFIX_TOKENS, self.scale)),))

    def conversation(self, slot: int, index: int, team: str = "default") -> Conversation:
        """The ``index``-th conversation of ``slot``: a pure function of (seed, slot, index)."""
        rng = random.Random(f"coding-agent/{self.seed}/{slot}/{index}")
        cid = f"s{slot}c{index}"
        assistant = rng.randrange(ASSISTANTS)
        start = rng.uniform(*START_TOKENS)
        limit = rng.uniform(*LIMIT_TOKENS)
        prefix = self.prefix_segment(assistant)
        task = Segment("user", ((f"{cid}/task", _scaled(start - PREFIX_TOKENS, self.scale)),))
        context = float(start)
        turns = [Turn((prefix, task), self._answer(rng), self._think(rng))]
        while True:
            answer = turns[-1].output_tokens / self.scale
            tool = self._tool(rng, context)
            if context + answer + tool > limit:
                break
            context += answer + tool
            n = len(turns)
            result = Segment("user", ((f"{cid}/tool{n}", _scaled(tool, self.scale)),))
            turns.append(Turn((result,), self._answer(rng), self._think(rng)))
        return Conversation(cid, team, slot, turns)

    def conversations(self, slot: int, team: str = "default") -> Iterator[Conversation]:
        index = 0
        while True:
            conv = self.conversation(slot, index, team)
            yield self._entered_midway(conv) if self.warm_start and index == 0 else conv
            index += 1

    def _entered_midway(self, conv: Conversation) -> Conversation:
        """``conv`` from a random turn k on: turn k's request carries turns 0..k-1 and their answers."""
        k = random.Random(f"coding-agent/warm/{self.seed}/{conv.slot}").randrange(len(conv.turns))
        if k == 0:
            return conv
        history: list[Segment] = []
        for i, turn in enumerate(conv.turns[:k]):
            history += turn.new
            history.append(answer_segment(f"{conv.cid}/history{i}", turn.output_tokens))
        head = conv.turns[k]
        merged = Turn((*history, *head.new), head.output_tokens, conv.turns[0].think_s)
        return Conversation(conv.cid, conv.team, conv.slot, [merged, *conv.turns[k + 1 :]])

    def _answer(self, rng: random.Random) -> int:
        lo, hi = ANSWER_TOKENS
        return _scaled(math.exp(rng.uniform(math.log(lo), math.log(hi))), self.scale)

    def _think(self, rng: random.Random) -> float:
        return rng.uniform(*THINK_S) * self.think_scale

    @staticmethod
    def _tool(rng: random.Random, context: float) -> float:
        frac = min(1.0, max(0.0, (context - TOOL_EARLY_AT) / (TOOL_LATE_AT - TOOL_EARLY_AT)))
        mean = TOOL_EARLY + (TOOL_LATE - TOOL_EARLY) * frac
        mu = math.log(mean) - TOOL_SIGMA**2 / 2  # log-normal with this mean
        return min(TOOL_CAP, rng.lognormvariate(mu, TOOL_SIGMA))


@dataclass
class TraceWorkload:
    """Open-loop replay of a Mooncake-format trace (module docstring)."""

    path: Path
    speedup: float = 1.0
    scale: float = 1.0
    seed: int = 1
    name: str = ""
    closed_loop: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.name:
            self.name = f"trace:{self.path}"
        if self.speedup <= 0:
            raise ValueError("--speedup must be positive")

    def requests(self, teams: list[TeamSpec] | None = None, until_s: float | None = None) -> Iterator[TraceRequest]:
        """Requests in arrival order, teams drawn by weight (``conversations``) per request."""
        teams = [t for t in (teams or []) if t.conversations > 0] or [TeamSpec("default", 1)]
        names = [t.name for t in teams]
        weights = [t.conversations for t in teams]
        rng = random.Random(f"trace/{self.seed}")
        horizon = None if until_s is None else until_s * self.speedup
        for i, row in enumerate(self.rows(horizon)):
            arrival = float(row["timestamp"]) / 1000.0 / self.speedup
            if until_s is not None and arrival > until_s:
                return
            team = names[0] if len(names) == 1 else rng.choices(names, weights)[0]
            yield TraceRequest(
                f"t{i}", arrival, team, self.segment(row), max(1, round(int(row["output_length"]) * self.scale))
            )

    def rows(self, horizon_s: float | None = None) -> Iterator[dict]:
        """The trace's rows in order (Mooncake fields); ``horizon_s``: trace seconds a replay needs
        (a generator in ``loadtest/workloads/`` stops there; the file is read lazily anyway)."""
        with self.path.open("rb") as fh:
            for line in fh:
                if line.strip():
                    yield orjson.loads(line)

    def segment(self, row: dict) -> Segment:
        hash_ids = row["hash_ids"]
        total = int(row["input_length"])
        pieces = []
        for j, h in enumerate(hash_ids):
            last = j == len(hash_ids) - 1
            n = total - TRACE_BLOCK_TOKENS * (len(hash_ids) - 1) if last else TRACE_BLOCK_TOKENS
            pieces.append((f"mc/{h}", _scaled(n, self.scale)))
        return Segment("user", tuple(pieces))


Workload = CodingAgent | TraceWorkload


def segment_blocks(segment: Segment, block_tokens: int) -> list[Block]:
    chain = PromptChain(block_tokens)
    chain.extend(segment)
    return chain.blocks
