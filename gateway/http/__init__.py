"""HTTP on both sides of the gateway: the server protocol with the limits uvicorn lacks (``server``), the
upstream client over llhttp (``wire``) and its connection pool (``wire_pool``), the OpenAI error envelope
every refusal is written in (``errors``) and the garbage collector's pauses on a relaying worker
(``gcpause``). Imports nothing else of the gateway."""
