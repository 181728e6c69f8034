"""CPU cost of the stream translators: microseconds per upstream chunk, Responses and Messages, next
to parsing the chunk alone (what a passthrough relay already does for its first token and usage).

Run: ``python -m loadtest.bench.translate [--chunks 600] [--rounds 30]``. One turn = reasoning,
text and one tool call cut into ``--chunks`` chunks of 4 characters (Kimi's ~1 token); each round
decodes the SSE bytes and translates every chunk; figures are the median and p99 over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson

from gateway.surfaces.translate import messages as M
from gateway.surfaces.translate import responses as R
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translate.messages_stream import MessagesStream
from gateway.surfaces.translate.responses_stream import ResponsesStream


def upstream(n: int) -> bytes:
    """SSE bytes of one turn: a third reasoning, a third text, a third tool-call arguments."""

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        body = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "kimi",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }
        return b"data: " + orjson.dumps(body) + b"\n\n"

    third = n // 3
    out = [chunk({"reasoning_content": "abcd"}) for _ in range(third)]
    out += [chunk({"content": "efgh"}) for _ in range(third)]
    out.append(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "functions.read_file:0",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"p'},
                    }
                ]
            }
        )
    )
    out += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ijkl"}}]}) for _ in range(n - 2 * third - 1)]
    out.append(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 1000, "completion_tokens": n, "prompt_tokens_details": {"cached_tokens": 900}}
    out.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n")
    return b"".join(out)


def run(translate: Callable[[bytes], int], data: bytes, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        translate(data)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    data = upstream(args.chunks)
    rreq = R.to_chat({"model": "kimi", "input": "hi", "stream": True})
    mreq = M.to_chat({"model": "kimi", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]})

    def parse_only(raw: bytes) -> int:
        return len(SSEDecoder().feed(raw))

    def responses(raw: bytes) -> int:
        s = ResponsesStream(rreq, "resp_b", 1.0)
        out = [s.start(), *(s.feed(p) for p in SSEDecoder().feed(raw)), s.finish()]
        return sum(map(len, out))

    def messages(raw: bytes) -> int:
        s = MessagesStream(mreq, "msg_b")
        out = [s.start(), *(s.feed(p) for p in SSEDecoder().feed(raw)), s.finish()]
        return sum(map(len, out))

    print(f"{args.chunks} chunks per turn, {args.rounds} rounds; µs per chunk (median / p99 of rounds)")
    for name, fn in (("parse only", parse_only), ("responses", responses), ("messages", messages)):
        times = sorted(run(fn, data, args.rounds))
        p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
        per = 1e6 / args.chunks
        print(f"{name:>11}: {statistics.median(times) * per:7.2f} / {p99 * per:7.2f}")


if __name__ == "__main__":
    main()
