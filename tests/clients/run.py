"""Run one SDK scenario against a base URL, in whichever venv has that SDK.

    PYTHON -m tests.clients.run NAME BASE_URL

Prints `{"client": "<distribution> <version>"}` on success; an SDK exception
exits non-zero with its traceback on stderr.  Scenarios run in their own
process so SDKs that need another `openai` major version (tests/clients/envs.py)
and SDKs that patch globals (litellm, the Agents SDK) stay out of the test process.
"""

from __future__ import annotations

import json
import sys

from tests.clients.drivers import BY_NAME


def main(argv: list[str]) -> int:
    name, base = argv
    scenario = BY_NAME[name]
    scenario.run(base)
    print(json.dumps({"client": scenario.client()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
