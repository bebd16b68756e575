"""SRv6 decapsulating endpoints (End.DT6/DT4/DT46, End.DX4/DX6) in eBPF: per-node host set-up.

The kernel's seg6local decapsulates in the SID route's input handler and hands the inner packet
to the normal forwarding path. Without seg6local no single BPF hook can do that (LWT programs
cannot remove bytes at the front; tc programs are not selected by a route), so each behaviour
is two programs of ``bpf/decap.c`` plus a helper device:

1. the SID stays a real kernel route, ``SID encap bpf xmit <srv6_decap_sid instance> dev DEV``,
   installed by iproute2 through :func:`loader.install_routes`. Its ``.rodata`` (behaviour,
   helper ifindex) is set per route. The program validates the packet (SRH Segments Left
   must be 0; inner header of the behaviour's family), counts it, and redirects it, still
   encapsulated, into the INGRESS of a helper device (``bpf_redirect(ifindex, BPF_F_INGRESS)``).
2. the helper device is an L3 ``tun`` device (no MAC header, so the redirect from LWT xmit is
   accepted: net/core/filter.c ``__bpf_redirect_no_mac``), one per DT table (shared by DT6,
   DT4 and DT46 SIDs of that table) and one per DX next hop. Its clsact ingress runs
   ``srv6_decap_strip``, which removes the outer IPv6 header and its extension headers
   (``bpf_skb_adjust_room`` with ``BPF_F_ADJ_ROOM_DECAP_L3_*``) and sets ``skb->protocol``.
3. the inner packet then enters ``ip_rcv``/``ipv6_rcv`` on the helper: PREROUTING, the routing
   decision, ``ip_forward``/``ip6_forward`` (TTL / hop limit decremented once), FORWARD,
   POSTROUTING, all with the real kernel code. Policy rules pick the table:

   - DT (``table N`` / ``vrftable N``): ``iif HELPER lookup N`` then ``iif HELPER unreachable``
     (IPv4 and IPv6), so a miss in table N never falls through to main (the kernel's
     seg6local answers a miss with its null entry: ICMP unreachable);
   - DX (``nh4 A`` / ``nh6 A``): ``iif HELPER lookup T`` then ``unreachable``, where the private
     table T holds ``default via A dev D`` (or ``via G`` when main reaches A through gateway G;
     ``unreachable default`` while A has no route), resolved in the main table when installed,
     as the kernel resolves nh4/nh6 in main per packet. This is a snapshot: after a change of
     the route to A, :meth:`DecapNode.resync` must re-resolve (a link deletion flushes T's
     route; until resync the SID's packets hit ``unreachable``).

Everything this module creates in a node (helper devices ``sr6d*`` with their clsact qdisc,
their rules at :data:`RULE_PREF` or 0, the private tables from :data:`DX_TABLE_BASE`, and with
``tables_before_local`` the ``lookup local`` rule moved to 1) must be hidden from the agent's
``ip``/``tc`` output by the node's ip front. Nothing is pinned after a call returns.

Requirements on the node: IPv6 forwarding on (the outer packet is forwarded to the SID route);
the SID route's device MTU at least the largest SRv6 packet (ip6_forward checks it: a bridge
``sr0`` takes ``mtu 65535``); ``net.ipv4.conf.all.rp_filter=0`` (the helper has no IPv4 address,
so any reverse-path filtering drops the inner IPv4 packet -- DX4 setups with the kernel's
seg6local disable rp_filter as well).

Differences from the kernel that remain (pinned by tests/test_ebpf_decap.py where testable):
the outer packet is routed through ``ip6_forward`` before the LWT xmit hook runs (outer hop
limit 1 gets ICMPv6 Time Exceeded; FORWARD/POSTROUTING see the outer packet; the SID route's
device MTU applies); the inner packet's input interface is the helper, not the receiving
interface; without ``tables_before_local`` the local table is consulted before table N;
PREROUTING always sees the inner packet (the kernel: DX4/DX6 only with
``net.netfilter.nf_hooks_lwtunnel=1``, DT4/DT46 on the VRF device); ``count`` cannot see what
happens after the redirect (the kernel counts a DX4 whose nh4 has no route, or a DT4 miss, as
an error; here they are packets, dropped by the ``unreachable`` rule).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from substrate.dataplane.ebpf import loader
from substrate.errors import SubstrateError

#: Behaviour codes of bpf/decap.c.
BEHAVIOURS: dict[str, int] = {"End.DT6": 1, "End.DT4": 2, "End.DT46": 3, "End.DX4": 4, "End.DX6": 5}
#: Preference of the helper rules (``lookup`` at RULE_PREF, ``unreachable`` at RULE_PREF + 1).
RULE_PREF = 100
#: First private table of the DX helpers (one table per DX next hop).
DX_TABLE_BASE = 0x7E000000
#: Name prefix of the helper devices (``sr6dtN`` for table N, ``sr6dxHHHHHHHH`` per DX next hop).
HELPER_PREFIX = "sr6d"
#: MTU of the helper devices (the largest: a decapsulated packet is never too big for them).
HELPER_MTU = 65535
#: Sysctls of each helper device (``{dev}``: its name): it forwards what it receives, in both
#: families, and no reverse-path filter drops a decapsulated packet for arriving on it.
HELPER_SYSCTLS = {
    "net.ipv4.conf.{dev}.rp_filter": "0",
    "net.ipv4.conf.{dev}.forwarding": "1",
    "net.ipv6.conf.{dev}.forwarding": "1",
    "net.ipv6.conf.{dev}.disable_ipv6": "0",
}
#: Run inside the node's namespace: create a persistent tun device, at a given index if not 0.
_MAKE_TUN = """
import fcntl, os, struct, sys
TUNSETIFF, TUNSETPERSIST, TUNSETIFINDEX = 0x400454CA, 0x400454CB, 0x400454DA
fd = os.open("/dev/net/tun", os.O_RDWR)
if int(sys.argv[2]):
    fcntl.ioctl(fd, TUNSETIFINDEX, struct.pack("I", int(sys.argv[2])))
fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", sys.argv[1].encode(), 0x0001 | 0x1000))  # IFF_TUN | IFF_NO_PI
fcntl.ioctl(fd, TUNSETPERSIST, 1)
"""


@dataclass(frozen=True)
class LinkState:
    """What :meth:`DecapNode.helper_intact` needs of a device (read by the caller, e.g. one
    RTM_GETLINK dump: name, IFF_UP, IFLA_MTU, and the IFLA_AF_SPEC devconf arrays)."""

    name: str
    up: bool
    mtu: int
    v4_forwarding: int
    v4_rp_filter: int
    v6_forwarding: int
    v6_disabled: int


#: The C functions.
SID_PROG = "srv6_decap_sid"
STRIP_PROG = "srv6_decap_strip"


def rodata(behaviour: str, ifindex: int, nh: str | None = None) -> bytes:
    """The ``.rodata`` image of bpf/decap.c (``cfg_behaviour``, ``cfg_ifindex``, ``cfg_nh_family``,
    ``cfg_nh``: 4 + 4 + 4 + 16 bytes). ``nh`` (a DX helper's strip program only): the next hop
    whose route the program checks per packet (decap.c ``dx_unroutable``)."""
    if nh is None:
        return struct.pack("<III", BEHAVIOURS[behaviour], ifindex, 0) + bytes(16)
    addr = ipaddress.ip_address(nh)
    return struct.pack("<III", BEHAVIOURS[behaviour], ifindex, addr.version) + addr.packed.ljust(16, b"\0")


class DecapError(SubstrateError):
    """A decap SID or its helper could not be set up (bad arguments, iproute2/tc refused)."""


@dataclass(frozen=True)
class DecapSid:
    """One decapsulating SID route, as the seg6local route it stands for.

    Attributes:
        sid: the SID prefix (``fc00:0:3:e000::/128``).
        behaviour: ``End.DT6``, ``End.DT4``, ``End.DT46``, ``End.DX4`` or ``End.DX6``.
        table: DT6 ``table N`` / DT4, DT46 ``vrftable N`` (and DT6 ``vrftable N``).
        nh: DX4 ``nh4`` / DX6 ``nh6``.
        dev: the route's device (``sr0``).
        route_table: the table the SID route goes into (None = main).
        metric: the route's metric (None = default).
    """

    sid: str
    behaviour: str
    table: int | None = None
    nh: str | None = None
    dev: str = "sr0"
    route_table: int | None = None
    metric: int | None = None

    def check(self) -> None:
        """Raises DecapError when the parameters do not fit the behaviour."""
        if self.behaviour not in BEHAVIOURS:
            raise DecapError(f"unknown decap behaviour {self.behaviour!r}")
        if self.behaviour.startswith("End.DT"):
            if not self.table or self.nh:
                raise DecapError(f"{self.behaviour} needs a table and no next hop")
        else:
            want = 4 if self.behaviour == "End.DX4" else 6
            if self.nh is None or ipaddress.ip_address(self.nh).version != want or self.table:
                raise DecapError(f"{self.behaviour} needs an IPv{want} next hop and no table")
        ipaddress.IPv6Network(self.sid, strict=False)

    def basename(self) -> str:
        """Pin basename, shown by ``ip route`` as the LWT program name. bpffs refuses names
        with a dot (EPERM, kernel/bpf/inode.c), so dots become dashes."""
        arg = f"table_{self.table}" if self.table else f"nh_{self.nh}"
        return f"{self.behaviour}_{arg}_count".replace("/", "_").replace(".", "-")


@dataclass
class _Helper:
    name: str
    ifindex: int
    table: int
    families: tuple[str, ...] = ("-4", "-6")
    nh: str | None = None
    strip_prog_id: int = 0
    #: The main table's (device, gateway) for ``nh`` when the private table was last written.
    resolved: tuple[str, str] | None = None


@dataclass
class InstalledSid:
    """A SID route in place: ``prog_id`` for :meth:`DecapNode.counters`."""

    sid: DecapSid
    helper: str
    prog_id: int
    line: str


@dataclass
class DecapNode:
    """The decap set-up of one node (network namespace ``netns``), driven from the host.

    Attributes:
        netns: the namespace name (``ip netns`` list).
        rule_pref: preference of the helper rules (``lookup`` at rule_pref, ``unreachable`` at
            rule_pref + 1).
        tables_before_local: put the helper rules BEFORE the ``lookup local`` rule, as the
            kernel's End.DT* looks up table N only: the helper rules go to preference 0 and the
            node's ``lookup local`` rule moves from 0 to 1 (both families, once per node;
            :meth:`teardown` moves it back). Off (the default): rule 0 ``lookup local`` sees
            the inner packet first, so an inner packet addressed to any local address of the
            node is delivered locally even if table N has no route for it.
        dx_table_base: first private DX table id.
    """

    netns: str
    rule_pref: int = RULE_PREF
    tables_before_local: bool = False
    dx_table_base: int = DX_TABLE_BASE
    helpers: dict[str, _Helper] = field(default_factory=dict)
    installed: list[InstalledSid] = field(default_factory=list)
    _local_moved: set[str] = field(default_factory=set)

    # ---------------------------------------------------------------- commands

    def _run(self, argv: Sequence[str], *, input: str | None = None) -> str:
        res = subprocess.run(list(argv), input=input, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise DecapError(f"{' '.join(argv[:6])}... failed: {res.stderr.strip() or res.stdout.strip()}")
        return res.stdout

    def _ip_batch(self, lines: Iterable[str], family: str | None = None) -> None:
        text = "\n".join(lines) + "\n"
        self._run(["ip", *([family] if family else []), "-n", self.netns, "-batch", "-"], input=text)

    def _sysctl(self, settings: dict[str, str]) -> None:
        """Write sysctls of the node (dotted names) from this thread, entered into its namespace
        (/proc/sys/net resolves per the calling thread's network namespace: no process)."""
        from substrate import nsread

        path = self.netns if self.netns.startswith("/") else f"/run/netns/{self.netns}"
        try:
            with nsread.entered(path):
                for k, v in settings.items():
                    with open("/proc/sys/" + k.replace(".", "/"), "w") as f:
                        f.write(v)
        except (OSError, nsread.NamespaceReadError) as e:
            raise DecapError(f"sysctl {', '.join(settings)} in {self.netns}: {e}") from None

    def _ifindex(self, name: str) -> int:
        out = self._run(["ip", "-n", self.netns, "-j", "link", "show", "dev", name])
        return int(json.loads(out)[0]["ifindex"])

    # ---------------------------------------------------------------- helpers

    def _adopt(self, name: str) -> int:
        """The index of a helper ``name`` an earlier worker made (a ``tun`` device), or 0 when
        there is none. A device of another kind under that name is not ours (a node's root can
        make one with an ``ip`` that bypasses its front): it is deleted, as it would silently
        take the decapsulated packets."""
        out = subprocess.run(["ip", "-n", self.netns, "-d", "-j", "link", "show", "dev", name], capture_output=True,
                             text=True, check=False).stdout  # fmt: skip
        link = (json.loads(out or "[]") or [None])[0]
        if link is None:
            return 0
        if link.get("linkinfo", {}).get("info_kind") == "tun":
            return int(link["ifindex"])
        self._run(["ip", "-n", self.netns, "link", "del", "dev", name])
        return 0

    def _create_device(self, name: str, ifindex: int = 0) -> int:
        """Create the helper ``tun`` device ``name`` (persistent, no packet info), with the
        interface index ``ifindex`` when given (TUNSETIFINDEX, drivers/net/tun.c: the SID
        programs that redirect to a helper hold its index in their read-only data, so a helper
        put back after a deletion must get its old index back). Returns its index."""
        import sys

        if ifindex:
            self._run(["ip", "netns", "exec", self.netns, sys.executable, "-c", _MAKE_TUN, name, str(ifindex)])
        else:  # iproute2's tuntap does the same, without the index (and without starting Python)
            self._ip_batch([f"tuntap add dev {name} mode tun"])
        return self._ifindex(name)

    def _configure(self, h: _Helper) -> None:
        """The helper device's settings (up, MTU, no addresses, its sysctls: HELPER_SYSCTLS)."""
        self._ip_batch([f"link set dev {h.name} addrgenmode none mtu {HELPER_MTU} up"])
        self._sysctl({k.format(dev=h.name): v for k, v in HELPER_SYSCTLS.items()})

    def helper_intact(self, h: _Helper, link: LinkState | None, ingress_progs: set[int]) -> bool:
        """Whether helper ``h`` is as :meth:`_ensure_helper` made it: its device (``link``: the
        node's device at ``h.ifindex``, None if there is none) has its name, is up, has its MTU
        and sysctls, and its tc ingress runs its strip program and nothing else (``ingress_progs``:
        one entry per filter there, :meth:`service.Node.ingress_progs`: a filter put before it
        decided for every packet, the second reconciler attack of issue 35)."""
        return (link is not None and link.name == h.name and link.up and link.mtu == HELPER_MTU
                and link.v4_forwarding == 1 and link.v4_rp_filter == 0 and link.v6_forwarding == 1
                and link.v6_disabled == 0 and list(ingress_progs) == [h.strip_prog_id])

    def restore(self, h: _Helper) -> None:
        """Put helper ``h`` back after a node changed or deleted it (a node's root can, with an
        ``ip`` or ``tc`` that bypasses the node's front: the kernel's seg6 has no such object to
        break): the device with its old index (a device of that name at another index is
        deleted first), its settings, its rules, its strip program and (DX) its table's route.

        Raises:
            DecapError: the index is taken by another device, or ip/tc refused.
        """
        try:
            at = self._ifindex(h.name)
        except DecapError:
            at = 0
        if at and at != h.ifindex:
            self._run(["ip", "-n", self.netns, "link", "del", "dev", h.name])
            at = 0
        if not at:
            self._create_device(h.name, h.ifindex)
        self._configure(h)
        # the clsact goes with every filter a node put on it (one before the strip program decides first)
        subprocess.run(["tc", "-n", self.netns, "qdisc", "del", "dev", h.name, "clsact"], capture_output=True, check=False)
        self._attach_strip(h)
        self.repair_rules(set())
        if h.nh:
            self._set_dx_route(h)

    def _helper_key(self, s: DecapSid) -> str:
        return f"t{s.table}" if s.table else f"x{ipaddress.ip_address(s.nh)}"

    def helper_name(self, s: DecapSid) -> tuple[str, int]:
        """(device name, table) of ``s``'s helper. Deterministic, so a host process that lost
        its state finds the helpers again: ``sr6dt<N>`` / table N for DT; ``sr6dx<8 hex of
        sha256(nh)>`` / table ``dx_table_base + <first 6 hex>`` for DX."""
        if s.table:
            return f"{HELPER_PREFIX}t{s.table}", s.table
        import hashlib

        digest = hashlib.sha256(ipaddress.ip_address(s.nh).packed).hexdigest()
        return f"{HELPER_PREFIX}x{digest[:8]}", self.dx_table_base + int(digest[:6], 16)

    def _ensure_helper(self, s: DecapSid) -> _Helper:
        key = self._helper_key(s)
        if key in self.helpers:
            return self.helpers[key]
        name, table = self.helper_name(s)
        if s.table:
            fams: tuple[str, ...] = ("-4", "-6")
        else:
            fams = ("-4",) if s.behaviour == "End.DX4" else ("-6",)
        if len(name) > 15:
            raise DecapError(f"helper name {name!r} too long (table id too large)")
        ifindex = self._adopt(name)
        if not ifindex:
            ifindex = self._create_device(name)
        h = _Helper(name=name, ifindex=ifindex, table=table, families=fams, nh=s.nh)
        self._configure(h)
        for fam in fams:
            if self.tables_before_local:
                self._move_local_rule(fam, 0, 1)
            lines = [f"rule add pref {self._pref(k)} iif {name} {action}" for k, action in ((0, f"lookup {table}"), (1, "unreachable"))]
            res = subprocess.run(["ip", fam, "-force", "-n", self.netns, "-batch", "-"], input="\n".join(lines) + "\n",
                                 capture_output=True, text=True, check=False)  # fmt: skip
            errors = [ln for ln in res.stderr.splitlines() if ln.strip() and "File exists" not in ln and "Command failed" not in ln]
            if errors:
                raise DecapError(f"ip rule add iif {name}: {' | '.join(errors)}")
        if s.nh:
            self._set_dx_route(h)
        self._attach_strip(h)
        self.helpers[key] = h
        return h

    def _pref(self, k: int) -> int:
        return 0 if self.tables_before_local else self.rule_pref + k

    def _move_local_rule(self, fam: str, old: int, new: int) -> None:
        """Move ``lookup local`` from preference ``old`` to ``new`` (add first, then delete, so
        local delivery never lapses); a no-op when it is not at ``old``."""
        if (fam in self._local_moved) == (new == 1):
            return
        rules = json.loads(self._run(["ip", fam, "-n", self.netns, "-j", "rule", "show"]) or "[]")
        if not any(r.get("priority") == old and r.get("table") == "local" and r.get("src") == "all"
                   and len(r) <= 3 for r in rules):
            return
        self._run(["ip", fam, "-n", self.netns, "rule", "add", "pref", str(new), "lookup", "local"])
        self._run(["ip", fam, "-n", self.netns, "rule", "del", "pref", str(old), "lookup", "local"])
        if new == 1:
            self._local_moved.add(fam)
        else:
            self._local_moved.discard(fam)

    def _set_dx_route(self, h: _Helper) -> None:
        """Point the private table of a DX helper at the next hop as the main table resolves it
        now (the kernel: ip_route_input / ip6_route_input_lookup of nh4/nh6, main table): a
        connected nh gives ``default via NH dev D``, a nh behind a gateway G gives ``default via
        G dev D`` (the kernel sends to G then too), no route gives ``unreachable default``."""
        fam = "-4" if ipaddress.ip_address(h.nh).version == 4 else "-6"
        res = subprocess.run(["ip", fam, "-n", self.netns, "-j", "route", "get", h.nh],
                             capture_output=True, text=True, check=False)
        route = None
        if res.returncode == 0:
            got = (json.loads(res.stdout or "[]") or [{}])[0]
            if got.get("dev") and got.get("dev") != "lo" and got.get("type", "unicast") == "unicast":
                route = ["default", "via", got.get("gateway", h.nh), "dev", got["dev"]]
        if route is not None:
            res = subprocess.run(["ip", fam, "-n", self.netns, "route", "replace", *route, "table", str(h.table)],
                                 capture_output=True, text=True, check=False)
            if res.returncode == 0:
                return
        self._run(["ip", fam, "-n", self.netns, "route", "replace", "unreachable", "default", "table", str(h.table)])

    def _attach_strip(self, h: _Helper) -> None:
        behaviour = "End.DT46" if not h.nh else "End.DX4" if ipaddress.ip_address(h.nh).version == 4 else "End.DX6"
        spec = loader.ProgramSpec(obj="decap", hooks={"xmit": STRIP_PROG},  # key only names the pin
                                  rodata=rodata(behaviour, h.ifindex, h.nh))
        obj = loader.load(spec)
        base = loader.pins_dir() if hasattr(loader, "pins_dir") else loader.bpffs_root()
        pin_dir = base / f"decap-{os.getpid()}-{self.netns}-{h.name}"
        try:
            pin_dir.mkdir(exist_ok=True)
            pin = pin_dir / "strip"
            with loader._lock:
                rc = loader._libbpf().bpf_obj_pin(obj.fds["xmit"], str(pin).encode())
            if rc:
                raise loader.BpfError(f"pin {pin}", loader._err(rc))
            self._run(["tc", "-n", self.netns, "qdisc", "replace", "dev", h.name, "clsact"])
            self._run(["tc", "-n", self.netns, "filter", "replace", "dev", h.name, "ingress", "pref", "1",
                       "handle", "1", "bpf", "da", "object-pinned", str(pin)])
            h.strip_prog_id = obj.ids["xmit"]
        finally:
            obj.close()
            for p in pin_dir.glob("*"):
                p.unlink()
            pin_dir.rmdir() if pin_dir.exists() else None

    # ---------------------------------------------------------------- SIDs

    def program(self, s: DecapSid, basename: str | None = None) -> loader.ProgramSpec:
        """The ProgramSpec of ``s``'s SID route (hook ``xmit``), creating its helper device,
        rules and (DX) private table first if needed. This is the entry point for whoever
        translates ``encap seg6local action End.D*`` requests: put the spec in a
        :class:`loader.RouteSpec` (``route add SID {encap} dev DEV ...``).

        Raises:
            DecapError: bad parameters, or the helper could not be set up.
        """
        s.check()
        h = self._ensure_helper(s)
        return loader.ProgramSpec(obj="decap", hooks={"xmit": SID_PROG}, rodata=rodata(s.behaviour, h.ifindex),
                                  basename=basename or s.basename())

    def install(self, sids: Sequence[DecapSid]) -> list[InstalledSid]:
        """Create the helpers the SIDs need, then add the SID routes in one ``ip -batch``.

        Raises:
            DecapError: bad parameters or a helper could not be set up.
            loader.RouteInstallError: iproute2 refused a route (earlier lines are installed).
            loader.BpfError: load failure.
        """
        specs, helpers = [], []
        for s in sids:
            prog = self.program(s)
            h = self.helpers[self._helper_key(s)]
            cmd = f"route add {s.sid} {{encap}} dev {s.dev}"
            if s.route_table:
                cmd += f" table {s.route_table}"
            if s.metric is not None:
                cmd += f" metric {s.metric}"
            specs.append(loader.RouteSpec(cmd, prog))
            helpers.append(h)
        done = loader.install_routes(self.netns, specs)
        out = [InstalledSid(s, h.name, r.prog_ids["xmit"], r.line) for s, h, r in zip(sids, helpers, done)]
        self.installed.extend(out)
        return out

    def counters(self, inst: InstalledSid) -> loader.Counters:
        """The SID's ``count`` counters (packets, bytes, errors)."""
        return loader.read_counters(inst.prog_id)

    def strip_stats(self) -> dict[str, tuple[int, int]]:
        """Per helper device: (packets stripped, packets dropped) by its ``srv6_decap_strip``; a
        DX packet dropped because its next hop had no route counts as dropped."""
        import ctypes

        out = {}
        for h in self.helpers.values():
            fd = loader._map_fd_of_prog(h.strip_prog_id, "stats")
            try:
                with loader._lock:
                    lib = loader._libbpf()
                    ncpu = lib.libbpf_num_possible_cpus()
                    vals = []
                    for k in (0, 1, 2):
                        buf = ctypes.create_string_buffer(8 * ncpu)
                        key = ctypes.c_uint32(k)
                        if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), buf):
                            raise loader.BpfError("bpf_map_lookup_elem(stats)")
                        vals.append(sum(int.from_bytes(buf.raw[8 * c: 8 * c + 8], "little") for c in range(ncpu)))
            finally:
                os.close(fd)
            out[h.name] = (vals[0], vals[1] + vals[2])
        return out

    def resync(self) -> None:
        """Re-resolve every DX next hop in the main table (after link or route changes)."""
        for h in self.helpers.values():
            if h.nh:
                self._set_dx_route(h)

    def repair_rules(self, present: set[tuple[int, int, str]]) -> int:
        """Put back the helpers' rules missing from ``present`` ((family 2 or 10, preference,
        input device) of every rule the node has): a rule deletion the node's ip could not
        refuse (``ip rule del table N`` matches a helper's rule first) must not let a
        decapsulated packet fall through to the main table. Returns how many were put back."""
        put = 0
        for h in self.helpers.values():
            for fam in h.families:
                af = 2 if fam == "-4" else 10
                for k, action in ((0, f"lookup {h.table}"), (1, "unreachable")):
                    if (af, self._pref(k), h.name) in present:
                        continue
                    subprocess.run(["ip", fam, "-n", self.netns, "rule", "add", "pref", str(self._pref(k)), "iif", h.name,
                                    *action.split()], capture_output=True, text=True, check=False)  # fmt: skip
                    put += 1
        return put

    def refresh(self, resolve: Callable[[str], tuple[str, str] | None],
                read_table: Callable[[int, int], list[tuple[int, int, str, str]]] | None = None) -> int:  # fmt: skip
        """Re-point each DX helper's private table whose next hop resolves differently now (the
        kernel resolves nh4/nh6 per packet; this follows within one call), or whose route is gone.
        ``resolve(nh)`` is the main table's (device, gateway) for ``nh`` -- a netlink
        ``RTM_GETROUTE``, no process -- or None when nothing routes it; ``read_table(family,
        table)`` the table's routes (:meth:`service.Node.table_routes`), which must be the one
        :meth:`_set_dx_route` wrote: the kernel flushes ``default via NH dev D`` with the last
        address of NH's subnet on D, and an address taken away and put back between two calls
        resolves as before (issue 35, the reconciler attack: the DX4 site lost for good); a node's
        root can rewrite the table with an iproute2 that bypasses its front (the second attack:
        another tenant's CE as the next hop). Only a change costs a flush and an ``ip route
        replace``. Returns how many tables changed."""
        changed = 0
        for h in self.helpers.values():
            if not h.nh:
                continue
            now = resolve(h.nh)
            fam = socket.AF_INET if ipaddress.ip_address(h.nh).version == 4 else socket.AF_INET6
            want = [(1, 0, now[0], now[1] or h.nh)] if now is not None else [(7, 0, "", "")]  # RTN_UNICAST, RTN_UNREACHABLE
            if now == h.resolved and (read_table is None or read_table(fam, h.table) == want):
                continue
            if read_table is not None:
                subprocess.run(["ip", "-4" if fam == socket.AF_INET else "-6", "-n", self.netns, "route", "flush", "table",
                                str(h.table)], capture_output=True, check=False)  # fmt: skip
            h.resolved = now
            self._set_dx_route(h)
            changed += 1
        return changed

    def teardown(self) -> None:
        """Remove the helpers, their rules and private tables (SID routes are the caller's:
        they go with their device or ``ip route del``). Best effort, never raises."""
        for h in list(self.helpers.values()):
            for fam in h.families:
                for pref in (self._pref(0), self._pref(1)):
                    subprocess.run(["ip", "-n", self.netns, fam, "rule", "del", "pref", str(pref), "iif", h.name],
                                   capture_output=True, check=False)
                if h.nh:
                    subprocess.run(["ip", "-n", self.netns, fam, "route", "flush", "table", str(h.table)],
                                   capture_output=True, check=False)
            subprocess.run(["ip", "-n", self.netns, "link", "del", "dev", h.name], capture_output=True, check=False)
        self.helpers.clear()
        for fam in sorted(self._local_moved):
            try:
                self._move_local_rule(fam, 1, 0)
            except DecapError:
                pass
