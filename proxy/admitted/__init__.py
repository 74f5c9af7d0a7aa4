"""One admitted request: count → decide → forward → relay → record.

Owns the surfaces (`surfaces`: what differs between chat, completions, Responses, Messages and the
pooling routes), the pure decision (`admission.decide`: pass, clamp or reject, and every
`max_tokens` rule), the count wherever the tokenizer lives (`counting`, `trust`; `heap` hands
back what a count freed), the request body parsed once (`jsonbody`), the relay's scanners (`sse`,
`answer`), the one answer worded for a single client (`codex`: a length refusal on a Codex turn)
and the exchange that drives them (`exchange.AdmittedExchange`, the only writer of the length
record). Imports `upstream/`, `recording/` and `sizing/`, never `serving/` or `workers/`.
"""
