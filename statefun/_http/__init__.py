"""HTTP/1.1 on asyncio protocols: the runtime's client for remote functions (``client``) and
the server of ``statefun serve`` and of the HTTP ingress (``server``), which share the chunked
body decoder (``chunked``).

Both exist because the general-purpose stack (aiohttp) cost most of the CPU on the hottest
paths of the runtime and of a function server; see docs/architecture.md.
"""
