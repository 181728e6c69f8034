"""Small asyncio helpers of the gateway's background loops (they live in ``backends/aio.py``, below
both the pool and the gateway)."""

from backends.aio import cancel_and_wait as cancel_and_wait
