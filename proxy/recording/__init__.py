"""What brimful records of every request: lengths and labels, never text.

Owns the `LengthRecord` (`record`), the `Recorder` every finished request reports to and its recent
window (`recorder`), the length log file (`lengthlog`), the Prometheus metrics (`metrics`), the live
view's figures (`stats`) and what the live view knows of each model beyond its traffic
(`live_sizing`). Imports `sizing/` and `upstream/`; the request path (`admitted/`) imports it.
"""
