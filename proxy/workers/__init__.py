"""`brimful serve --workers N`: several serving processes on one port that answer as one.

Owns the supervisor that forks and restarts the workers (`supervisor`), a slot's socket served
by another worker while its own does not serve (`handover`), how they reach each other
(`siblings`), one worker's share of the pages and the merge of all shares (`shard`), and the
pages that answer for every worker (`pages`). Imports `recording/` and `sizing/`.
"""
