"""The offline subcommands: `brimful count`, `brimful plan`, `brimful report`.

Each module parses its arguments and formats its answer; the maths is in `sizing/` and the count in
`tokenizer_cache`. `proxy.cli` dispatches to them.
"""
