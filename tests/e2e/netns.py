"""Separate hosts on one machine: Linux network namespaces on a bridge (needs root and iproute2).

    hosts = NamespaceHosts(["a", "b"])   # 10.x.y.2, 10.x.y.3 on a bridge whose address (.1) is this namespace's
    hosts.popen("a", [...], env=...)     # a process inside host "a" (its own loopback, its own ports)
    hosts.close()                        # kills every process in the namespaces, deletes them and the bridge

Each host has its own network stack: a socket bound on loopback in one is out of
reach of the others, so only what binds on the host's address crosses, as
between real machines. Names carry this process's id, so parallel runs do not meet.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess


def usable() -> str | None:
    """None when namespaces can be made here; else why not (for a skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"tdmprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NamespaceHosts:
    def __init__(self, names: list[str]):
        tag = os.getpid() % 100000
        self.subnet = f"10.{77 + tag % 100}.{tag % 250}"
        self.bridge = f"tdmbr{tag}"
        self.netns = {name: f"tdm{tag}{name}" for name in names}
        self.address = {name: f"{self.subnet}.{i + 2}" for i, name in enumerate(names)}
        self.gateway = f"{self.subnet}.1"  # this (the test's) namespace on the bridge
        self._procs: list[subprocess.Popen] = []
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                self._add_host(name, i)
        except BaseException:
            self.close()
            raise

    def _add_host(self, name: str, index: int) -> None:
        netns, outside, inside = self.netns[name], f"{self.bridge}o{index}", f"{self.bridge}i{index}"
        self._ip("netns", "add", netns)
        self._ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        self._ip("link", "set", inside, "netns", netns)
        self._ip("link", "set", outside, "master", self.bridge)
        self._ip("link", "set", outside, "up")
        self._ip("-n", netns, "addr", "add", f"{self.address[name]}/24", "dev", inside)
        self._ip("-n", netns, "link", "set", inside, "up")
        self._ip("-n", netns, "link", "set", "lo", "up")

    def popen(self, name: str, command: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns[name], *command], **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, name: str, command: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns[name], *command], timeout=timeout_s, **kwargs)

    def close(self) -> None:
        """Idempotent: every process left in the hosts is killed (Ray's daemons too), then the network goes."""
        for netns in self.netns.values():
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            proc.wait(timeout=30)
        for netns in self.netns.values():
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)
