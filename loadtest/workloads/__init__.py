"""The routing family: seeded generators of Mooncake-format traces, each stressing routing in its
own way and each documented (in its module) with the published statistic it reproduces. Besides
these, the family has ``coding-agent`` (``loadtest/workloads/core.py``) and the public Mooncake conversation
trace (``trace:PATH``); ``loadtest/analysis/routing_family.py`` compares the routers on all of them.

``tuning`` says whether the router's defaults were chosen on a member; the held-out members
(``two-assistants``, ``zipf-hot``, ``mooncake-synth``) were run only after the defaults were fixed.
"""

from __future__ import annotations

from loadtest.workloads.agents import agents_and_completions
from loadtest.workloads.base import GeneratedTrace, Member
from loadtest.workloads.chat import bursty_chat, chat_shared_prompt, two_assistants
from loadtest.workloads.documents import zipf_docs, zipf_hot
from loadtest.workloads.mooncake_synth import mooncake_synth

_MEMBERS = [
    Member("chat-shared-prompt", chat_shared_prompt, True, "LMSYS-Chat-1M session shape"),
    Member("zipf-docs", zipf_docs, True, "ATC'25 KV-cache reuse skew, Zipf s = 0.8"),
    Member("bursty-chat", bursty_chat, True, "BurstGPT on/off arrivals"),
    Member("agents-and-completions", agents_and_completions, True, "coding-agent + Splitwise coding completions"),
    Member("two-assistants", two_assistants, False, "conversations handed between two assistants"),
    Member("zipf-hot", zipf_hot, False, "ATC'25 KV-cache reuse skew, Zipf s = 1.2"),
    Member("mooncake-synth", mooncake_synth, False, "Mooncake FAST'25 conversation-trace statistics"),
]
FAMILY: dict[str, Member] = {m.name: m for m in _MEMBERS}
"""Generated members by name (``--workload NAME`` of ``cachegate simulate``)."""

__all__ = ["FAMILY", "GeneratedTrace", "Member"]
