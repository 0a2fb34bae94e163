"""The far tier's watchdog on real sockets (a pure unit: no server involved)."""

from __future__ import annotations

import socket
import time

from delay_broker.far.watchdog import Watchdog


def test_a_call_past_its_deadline_has_its_socket_shut_and_one_within_it_does_not() -> None:
    watchdog = Watchdog()
    late, peer = socket.socketpair()
    with late, peer, watchdog.guard(late.fileno(), 0.2):
        late.settimeout(5)
        assert late.recv(1) == b"", "the pending read returns: the socket was shut"
    quick, other = socket.socketpair()
    with quick, other:
        with watchdog.guard(quick.fileno(), 0.2):
            pass
        time.sleep(0.4)
        other.sendall(b"x")
        assert quick.recv(1) == b"x"


def test_a_descriptor_forgotten_before_it_is_closed_is_never_shut_in_its_next_life() -> None:
    """A connection dropped while a guard on it is open: its number may be the next connection's."""
    watchdog = Watchdog()
    first, _ = socket.socketpair()
    number = first.fileno()
    with watchdog.guard(number, 0.2):
        watchdog.forget(number)
        first.close()
        reused, peer = socket.socketpair()
        with reused, peer:
            time.sleep(0.4)
            peer.sendall(b"x")
            assert reused.recv(1) == b"x", "the new socket on a reused number still works"
    _.close()
