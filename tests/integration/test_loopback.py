"""Nothing paraplan starts listens beyond this machine: the ranks of `validate` (and
`bench`) serve their rendezvous store and gloo's sockets on the loopback interface only
(issue 21: `validate`'s store listened on every interface, IPv4 and IPv6)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

from paraplan.comm.bench import rendezvous_socket
from paraplan.validate.ranks import run_ranks

pytestmark = pytest.mark.integration

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def _address(hex_address: str) -> str:
    """/proc/net/tcp's local address (host byte order per 32-bit word) as text."""
    host = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(host[i:i + 4][::-1] for i in range(0, len(host), 4))
    return str(ipaddress.ip_address(words))


def listening_addresses(pid: int | str = "self") -> list[str]:
    """The local addresses of the TCP sockets process `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                found.append(_address(fields[1]))
    return found


def _listening_rank(rank: int, world: int) -> list[str]:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))  # the store and gloo's pairs are up
    return listening_addresses()


def test_the_address_reader_sees_a_socket_on_every_interface():
    with socket.create_server(("", 0)) as anywhere, rendezvous_socket() as loopback:
        found = listening_addresses()
        assert "0.0.0.0" in found or "::" in found
        assert "127.0.0.1" in found
        del anywhere, loopback


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_validate_ranks_listen_on_loopback_only():
    found = run_ranks(_listening_rank, world_size=2, timeout_s=120)
    assert found[0], "rank 0 serves the rendezvous store: it listens somewhere"
    everything = [address for rank in found for address in rank]
    assert all(ipaddress.ip_address(a).is_loopback for a in everything), everything
