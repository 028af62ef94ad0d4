"""Hosts with their own addresses, for partitions that are real: each
``Host`` is a network namespace the suite creates (``ip netns``) joined to
this one by a veth pair on a /30 of its own. A process started in it
(``Host.argv``) reaches the replicas only through that link, at
``Host.gateway``; ``partition`` drops its packets with nftables inside the
namespace (both ways, or only what it sends, or only what it receives),
``lossy`` drops a share of them at random and can hold the link to a slow
rate (``tc`` token bucket both ways: what exceeds it queues, up to 400 ms),
``heal`` ends a partition.

Needs root, iproute2 and nftables (``available`` says what is missing). A
fixed delay (``tc netem``) is not used: the kernels the suite runs on here
have no netem qdisc.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

from replicas import log

_hosts = itertools.count()


def available() -> str:
    """Empty when hosts can be made; else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, nftables)"
    probe = f"sy{os.getpid()}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        table = subprocess.run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe"],
                               capture_output=True, text=True)
        if table.returncode != 0:
            return f"nftables does not work in a namespace: {table.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Host:
    def __init__(self, label: str) -> None:
        n = next(_hosts)
        pid = os.getpid()
        self.label = label
        self.ns = f"sy{pid}h{n}"
        outside, inside = f"sy{pid % 100000}o{n}", f"sy{pid % 100000}i{n}"
        base = f"10.{100 + pid % 100}.{n // 64}.{(n % 64) * 4}"
        prefix = base.rsplit(".", 1)[0]
        last = int(base.rsplit(".", 1)[1])
        self.gateway = f"{prefix}.{last + 1}"
        self.address = f"{prefix}.{last + 2}"
        self.loss = 0
        _ip("netns", "add", self.ns)
        try:
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", self.ns)
            _ip("addr", "add", f"{self.gateway}/30", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.address}/30", "dev", inside)
            _ip("-n", self.ns, "link", "set", inside, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            self.close()
            raise
        self.inside = inside
        self.outside = outside
        log(f"host {label}: namespace {self.ns}, {self.address} via {self.gateway}")

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def _rules(self, output: str, input_: str) -> None:
        self._clear()
        script = (
            "table inet chaos {\n"
            f"  chain out {{ type filter hook output priority 0; policy accept; {output}; }}\n"
            f"  chain in {{ type filter hook input priority 0; policy accept; {input_}; }}\n"
            "}\n"
        )
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=script, check=True,
                       capture_output=True, text=True)

    def _clear(self) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "chaos"],
                       capture_output=True)

    def partition(self, direction: str = "both", port: int = 0) -> None:
        """Drops every packet on the link: ``both`` ways, only what the host
        sends (``out``), or only what reaches it (``in``); with ``port``, only
        its TCP traffic to and from that port on the other side."""
        to = f" tcp dport {port}" if port else ""
        from_ = f" tcp sport {port}" if port else ""
        out = f'oifname "{self.inside}"{to} drop' if direction in ("both", "out") else ""
        in_ = f'iifname "{self.inside}"{from_} drop' if direction in ("both", "in") else ""
        self._rules(out, in_)
        log(f"host {self.label}: partitioned ({direction}{f', port {port}' if port else ''})")

    def lossy(self, percent: int, rate_kbit: int = 0) -> None:
        """From now on (partitions aside) drops ``percent`` % of the packets
        each way, at random; with ``rate_kbit``, the link carries at most
        that much each way, what exceeds it waiting in a queue of up to
        400 ms (a token bucket filter)."""
        self.loss = percent
        self._apply_loss()
        if rate_kbit:
            tbf = ["root", "tbf", "rate", f"{rate_kbit}kbit", "burst", "4kb", "latency", "400ms"]
            _ip("netns", "exec", self.ns, "tc", "qdisc", "add", "dev", self.inside, *tbf)
            subprocess.run(["tc", "qdisc", "add", "dev", self.outside, *tbf], check=True, capture_output=True)
        log(f"host {self.label}: {percent}% packet loss each way"
            + (f", at most {rate_kbit} kbit/s each way" if rate_kbit else ""))

    def _apply_loss(self) -> None:
        if not self.loss:
            self._clear()
            return
        rule = '{} "{}" numgen random mod 100 < {} drop'
        self._rules(rule.format("oifname", self.inside, self.loss), rule.format("iifname", self.inside, self.loss))

    def heal(self) -> None:
        """The partition ends; the link's loss, if any, stays."""
        self._apply_loss()
        log(f"host {self.label}: healed")

    def close(self) -> None:
        # Deleting the namespace deletes the veth pair with it.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
