"""Engine-side state of one request and of one rank (KV pool, radix cache, queue, running batch)."""

from __future__ import annotations

from collections import deque
from itertools import accumulate

from backends.sim.engine_types import EngineCounters, EngineRequest
from backends.sim.radix import Node, RadixCache

WAITING, PREFILL, RUNNING, DONE = 0, 1, 2, 3
HIT_WINDOW = 32  # prefill batches behind cache_hit_rate
GEN_WINDOW_S = 10.0  # engine seconds behind gen_throughput


class ReqState:
    """Engine-side state of one request (KV held = tree path + private tokens)."""

    __slots__ = (
        "blocks",
        "cached",
        "ends",
        "ereq",
        "fill_len",
        "fin_step",
        "first_done",
        "gen",
        "kv",
        "m_epoch",
        "m_gpu",
        "m_host",
        "max_new",
        "nblk",
        "node",
        "pending",
        "prompt_len",
        "rank",
        "retractions",
        "rid",
        "state",
        "step_base",
        "target",
        "tree_len",
    )

    def __init__(self, ereq: EngineRequest, rank: int, root: Node) -> None:
        self.ereq = ereq
        self.rid = ereq.rid
        self.rank = rank
        self.blocks = ereq.prompt
        self.ends = list(accumulate(n for _, n in ereq.prompt))
        self.prompt_len = self.ends[-1] if self.ends else 0
        self.target = max(1, ereq.output_tokens)
        self.max_new = ereq.max_new_tokens
        self.state = WAITING
        self.gen = 0  # output tokens so far (while running: at step_base)
        self.step_base = 0
        self.fill_len = self.prompt_len
        self.kv = 0  # tokens computed (prefill progress), while not running
        self.pending = 0  # tokens allocated for the chunk in flight
        self.node = root  # deepest locked node
        self.tree_len = 0  # tokens covered by the locked path
        self.nblk = 0  # prompt blocks covered by the locked path
        self.cached = 0
        self.first_done = False
        self.retractions = 0
        self.fin_step = 0
        self.m_epoch = -1
        self.m_gpu = 0
        self.m_host = 0


class RankState:
    def __init__(
        self, idx: int, cap: int, host_capacity: int, ratio: float, counters: EngineCounters, free_order: bool = False
    ) -> None:
        self.idx = idx
        self.counters = counters
        self.cap = cap
        self.cache = RadixCache(host_capacity, stamp_on_free=free_order)
        self.waiting: list[ReqState] = []
        self.running: dict[str, ReqState] = {}
        self.chunked: ReqState | None = None
        self.private = 0  # KV tokens held by requests outside the tree
        self.ctx_sum = 0  # Σ (prompt + generated) over running requests
        self.steps = 0  # decode steps completed
        self.fin_heap: list[tuple[int, int, ReqState]] = []
        self.ratio = ratio
        self.work: tuple[str, list[tuple[ReqState, int, int]], float] | None = None
        self.hits: deque[tuple[int, int]] = deque(maxlen=HIT_WINDOW)
        self.gen_window: deque[tuple[float, int]] = deque()
        self.gen_window_sum = 0
        self.blocked: tuple[ReqState, int, int, int] | None = None  # (head, epoch, need, path evictable)

    @property
    def free(self) -> int:
        return self.cap - self.cache.gpu_tokens - self.private

    def ensure_free(self, n: int) -> bool:
        short = n - self.free
        if short > 0:
            self.counters.evicted_tokens += self.cache.evict(short)
        return self.free >= n

    def gen_of(self, r: ReqState) -> int:
        return r.gen + (self.steps - r.step_base) if r.state == RUNNING else r.gen

    def private_of(self, r: ReqState) -> int:
        if r.state == RUNNING:
            return r.prompt_len + self.gen_of(r) - 1 - r.tree_len
        return r.kv + r.pending - r.tree_len
