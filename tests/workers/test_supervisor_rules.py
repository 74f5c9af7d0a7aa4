"""proxy.workers.supervisor's rules, without forking: the back-off, and a replacement's socket."""

from __future__ import annotations

import socket

from proxy.workers.supervisor import BACKOFF_MAX_S, _accepting, backoff_s, bound_socket, listening_sockets


def test_a_slot_backs_off_only_after_quick_exits_doubling_to_a_cap() -> None:
    assert backoff_s(0, startup_failure=False) == 0        # a worker that ran a while: replaced at once
    assert [backoff_s(n, startup_failure=False) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff_s(0, startup_failure=True) == 1         # could not start: never at once
    assert backoff_s(40, startup_failure=False) == BACKOFF_MAX_S


def test_a_replacement_socket_shares_the_port_but_takes_no_connection_until_it_listens() -> None:
    [living] = listening_sockets("127.0.0.1", 0, 1)
    port = living.getsockname()[1]
    fresh = bound_socket(socket.AF_INET, ("127.0.0.1", port))
    try:
        assert _accepting(living) and not _accepting(fresh)
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            accepted, _ = living.accept()            # the kernel gave it to the listening socket
            accepted.close()
        fresh.listen(8)
        assert _accepting(fresh)
    finally:
        fresh.close()
        living.close()
