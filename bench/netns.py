"""Two stand-in hosts for workers: Linux network namespaces, each joined to this one by a veth link.

Each link is a /30 of its own: this host's end, the address the namespace's workers reach it
at, and the namespace's end. A namespace's default route points at this host's end, so its
processes can reach either of this host's link addresses. Everything here is created under
names no one else uses and removed by ``remove``, which also clears what a crashed run left.
Needs root and iproute2's ``ip``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass


class NamespacesUnavailable(Exception):
    """The namespaces could not be made: not root, no ``ip``, or ``ip`` refused."""


@dataclass(frozen=True)
class Link:
    namespace: str
    host_device: str  # at most 15 characters, as every interface name
    namespace_device: str
    host_address: str
    namespace_address: str
    prefix: int = 30

    def run(self, *command: str) -> list[str]:
        """``command`` to run inside this namespace."""
        return ["ip", "netns", "exec", self.namespace, *command]


LINKS = (
    Link("pgjobs-bench-a", "pgjb-a-host", "pgjb-a-ns", "10.213.0.1", "10.213.0.2"),
    Link("pgjobs-bench-b", "pgjb-b-host", "pgjb-b-ns", "10.213.0.5", "10.213.0.6"),
)


def _ip(*args: str) -> None:
    completed = subprocess.run(["ip", *args], capture_output=True, text=True)
    if completed.returncode != 0:
        raise NamespacesUnavailable(
            f"`ip {' '.join(args)}` failed: {completed.stderr.strip() or completed.returncode}"
        )


def _exists(link: Link) -> tuple[bool, bool]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    device = subprocess.run(["ip", "link", "show", link.host_device], capture_output=True)
    return (any(line.split()[:1] == [link.namespace] for line in namespaces.splitlines()),
            device.returncode == 0)


def create(links: Sequence[Link] = LINKS) -> None:
    """Make each namespace and its link, after clearing any left by an earlier run."""
    if os.geteuid() != 0:
        raise NamespacesUnavailable("network namespaces need root; run this as root")
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("iproute2's `ip` is not on the PATH")
    remove(links)
    try:
        for link in links:
            _ip("netns", "add", link.namespace)
            _ip("link", "add", link.host_device, "type", "veth",
                "peer", "name", link.namespace_device, "netns", link.namespace)
            _ip("addr", "add", f"{link.host_address}/{link.prefix}", "dev", link.host_device)
            _ip("link", "set", link.host_device, "up")
            inside = ("-n", link.namespace)
            _ip(*inside, "addr", "add", f"{link.namespace_address}/{link.prefix}",
                "dev", link.namespace_device)
            _ip(*inside, "link", "set", link.namespace_device, "up")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "route", "add", "default", "via", link.host_address)
    except BaseException:
        remove(links)
        raise


def remove(links: Sequence[Link] = LINKS) -> None:
    """Stop what still runs in the namespaces and delete them and their links; never fails."""
    for link in links:
        has_namespace, has_device = _exists(link)
        if has_namespace:
            pids = subprocess.run(["ip", "netns", "pids", link.namespace],
                                  capture_output=True, text=True).stdout.split()
            for pid in pids:  # only processes this module's namespaces hold: ours
                with suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", link.namespace], capture_output=True)
        # Deleting the namespace deletes its end of the veth pair and with it this end.
        if has_device and _exists(link)[1]:
            subprocess.run(["ip", "link", "del", link.host_device], capture_output=True)
