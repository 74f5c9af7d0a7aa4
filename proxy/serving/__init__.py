"""The client side of brimful: the wire and what brimful answers itself.

Owns the HTTP server (`server`: uvicorn's httptools protocol with the limits it lacks), the probes
(`health`: GET /ready, /live), brimful's own pages (`pages`: /metrics, /stats, /dashboard), the
relay of everything not admitted (`passthrough`) and `count_tokens` (POST /v1/messages/count_tokens).
Sits above `admitted/`, `upstream/`, `recording/` and `workers/`; only `proxy.app` and `proxy.cli` import it.
"""
