"""Run the conformance corpus on one SRv6 data plane and write what every command printed.

``python3 conformance/runner.py --plane kernel|ebpf --out FILE.json [--only CASE,...] [--no-probes]``

The same script runs on both sides of the differential suite (issue 34, "Conformance against the
kernel itself"):

- ``kernel``: the plain iproute2 ``ip`` on a kernel with seg6 (in this project: Debian's stock
  kernel in a qemu guest, :mod:`conformance.guest`, whose root file system is the host's, so the
  ``ip`` binary and this script are the very same files);
- ``ebpf``: the same ``ip`` with the project's netlink shim preloaded, served by an eBPF data-plane
  service started here for the corpus's namespaces, exactly as a lab's host-side ``ip -n NETNS``
  runs (:func:`substrate.dataplane.ebpf.front.host_env`).

Commands: every case of ``corpus/commands.txt`` (format in its header, :func:`parse_corpus`) runs
in a fresh network namespace with the same base set-up on both planes; stdout, stderr and exit
status of each command are recorded. Packets: :mod:`conformance.probes` (the h1 - r1 - r2 - r3 - h3
uSID path), unless ``--no-probes``.

Standard library only (the guest runs it with the host's ``/usr/bin/python3``, no venv needed);
the ``ebpf`` plane imports :mod:`substrate` from the repository it sits in.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CORPUS = HERE / "corpus" / "commands.txt"
#: Where a case's files (``@file``) are written; the same path on both planes, so that iproute2's
#: "Command failed FILE:LINE" reads the same.
WORK_DIR = Path("/tmp/anibench-conformance")
PLANES = ("kernel", "ebpf")
#: Base set-up of every case's namespace (``ip -batch`` lines), the same on both planes: veth pairs
#: (dummy devices are missing on the CI kernel; a bridge without ports loses its carrier when its
#: address is set, so routes through it show ``linkdown`` or not), fixed MAC addresses.
BASE_SETUP = [
    "link set lo up",
    "link add dum0 address 02:00:00:00:aa:01 type veth peer name dum0p address 02:00:00:00:aa:11",
    "link set dum0p addrgenmode none up",
    "link set dum0 up",
    "addr add 2001:db8:a::1/64 dev dum0 nodad",
    "addr add 192.0.2.1/24 dev dum0",
    "link add sr0 address 02:00:00:00:aa:02 mtu 65535 type veth peer name sr0p address 02:00:00:00:aa:12 mtu 65535",
    "link set sr0p addrgenmode none up",
    "link set sr0 up",
]
BASE_SYSCTLS = {
    "net.ipv6.conf.all.accept_dad": "0", "net.ipv6.conf.default.accept_dad": "0",
    "net.ipv6.conf.all.forwarding": "1", "net.ipv4.ip_forward": "1",
}  # fmt: skip
#: Bounds on one command and on the service's start (``$ANIBENCH_COMMAND_TIMEOUT_S``: the TCG guest on a
#: loaded host needs far longer).
COMMAND_TIMEOUT_S = float(os.environ.get("ANIBENCH_COMMAND_TIMEOUT_S", "60"))
SERVICE_READY_TIMEOUT_S = 60.0


@dataclass
class Step:
    """One line of a case.

    Attributes:
        line: the command as written (``ip ...`` or ``sysctl ...``), or the file name of an ``@file``.
        stdin: the heredoc's text, if any.
        plane: ``kernel`` or ``ebpf`` for a set-up step of that plane only (recorded, not
            compared); None for a compared command.
        file: whether this is an ``@file NAME`` step (``stdin`` is written to ``{dir}/NAME``).
    """

    line: str
    stdin: str | None = None
    plane: str | None = None
    file: bool = False


@dataclass
class Case:
    """A named command script, run in a fresh namespace."""

    name: str
    steps: list[Step] = field(default_factory=list)
    comment: str = ""


def parse_corpus(text: str) -> list[Case]:
    """Parse the corpus format (see the header of ``corpus/commands.txt``).

    Raises:
        ValueError: a line outside a case, an unterminated heredoc, an unknown directive.
    """
    cases: list[Case] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        i += 1
        s = raw.strip()
        if not s:
            continue
        if s.startswith("#"):
            if cases and s.startswith("# ") and not cases[-1].steps:
                cases[-1].comment += s[2:] + " "
            continue
        if s.startswith("=== "):
            cases.append(Case(s[4:].strip()))
            continue
        if not cases:
            raise ValueError(f"line {i}: {s!r} outside a case")
        stdin = None
        if s.endswith("<<EOF"):
            s = s[: -len("<<EOF")].rstrip()
            body: list[str] = []
            while i < len(lines) and lines[i] != "EOF":
                body.append(lines[i])
                i += 1
            if i >= len(lines):
                raise ValueError(f"unterminated heredoc in case {cases[-1].name}")
            i += 1
            stdin = "\n".join(body) + "\n"
        plane = None
        is_file = False
        if s.startswith("@"):
            word, _, rest = s.partition(" ")
            if word in ("@kernel", "@ebpf"):
                plane, s = word[1:], rest.strip()
            elif word == "@file":
                is_file, s = True, rest.strip()
                if stdin is None:
                    raise ValueError(f"@file without a heredoc in case {cases[-1].name}")
            else:
                raise ValueError(f"unknown directive {word!r} in case {cases[-1].name}")
        if not is_file and shlex.split(s)[0] not in ("ip", "sysctl"):
            raise ValueError(f"case {cases[-1].name}: only ip and sysctl commands are run, not {s!r}")
        cases[-1].steps.append(Step(s, stdin, plane, is_file))
    return cases


def load_corpus(path: Path = CORPUS) -> list[Case]:
    """The cases of the corpus file."""
    return parse_corpus(path.read_text())


def command_count(cases: list[Case]) -> int:
    """How many commands of ``cases`` are compared (set-up and file steps excluded)."""
    return sum(1 for c in cases for s in c.steps if s.plane is None and not s.file)


# -- data planes ----------------------------------------------------------------------------------


class Plane:
    """The kernel's own seg6: ``ip`` as it is."""

    name = "kernel"

    def start(self, nodes: dict[str, str]) -> None:
        """Get ready to serve ``nodes`` (node name -> netns name), which exist already."""

    def env(self, node: str) -> dict[str, str] | None:
        """The environment an ``ip -n`` for ``node`` runs with (None: this process's)."""
        return None

    def stop(self) -> None:
        """Release what :meth:`start` took."""


class EbpfPlane(Plane):
    """The project's eBPF data plane: a data-plane service for the namespaces, the netlink shim
    preloaded into ``ip`` (as a lab's host-side ``ip -n`` runs)."""

    name = "ebpf"

    def __init__(self) -> None:
        self.lab_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, nodes: dict[str, str]) -> None:
        """Build the programs and the shim if needed, write the shim files and start a service
        for ``nodes``; waits (bounded) for it to say ``ready``.

        Raises:
            RuntimeError: the service did not come up.
        """
        sys.path.insert(0, str(REPO))
        from substrate.dataplane import select as select_plane
        from substrate.dataplane.ebpf import front

        choice = select_plane("ebpf")
        if choice.dataplane != "ebpf":
            raise RuntimeError(choice.line())
        self.lab_dir = Path(tempfile.mkdtemp(prefix="anibench-conformance-ebpf-"))
        front.prepare_lab(self.lab_dir)
        argv = [sys.executable, "-m", "substrate.dataplane.ebpf.service", str(self.lab_dir),
                *[f"{n}=/run/netns/{ns}" for n, ns in nodes.items()]]  # fmt: skip
        log = open(self.lab_dir / "service.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO))
        log.close()
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVICE_READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.stop()
            raise RuntimeError("the eBPF data-plane service did not start")

    def env(self, node: str) -> dict[str, str] | None:
        """:func:`substrate.dataplane.ebpf.front.host_env` for ``node``."""
        from substrate.dataplane.ebpf import front

        assert self.lab_dir is not None
        return front.host_env(self.lab_dir, node)

    def stop(self) -> None:
        """Stop the service (SIGTERM, then SIGKILL after a bounded wait) and remove its directory."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None
        if self.lab_dir is not None:
            shutil.rmtree(self.lab_dir, ignore_errors=True)
            self.lab_dir = None


def make_plane(name: str) -> Plane:
    """The :class:`Plane` called ``name``."""
    if name not in PLANES:
        raise ValueError(f"unknown data plane {name!r}")
    return EbpfPlane() if name == "ebpf" else Plane()


# -- namespaces -----------------------------------------------------------------------------------


def run(argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run ``argv`` (no shell), capturing text output; a timeout is returned as exit status 124."""
    try:
        return subprocess.run(argv, env=env, input=stdin if stdin is not None else "", capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout} s\n")


def check(argv: list[str], **kw: object) -> str:
    """:func:`run`, raising on a non-zero exit status; returns stdout."""
    r = run(argv, **kw)  # type: ignore[arg-type]
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def add_netns(name: str, sysctls: dict[str, str] | None = None) -> None:
    """Create network namespace ``name`` (``ip netns add``) and set ``sysctls`` in it."""
    check(["ip", "netns", "add", name])
    if sysctls:
        set_sysctls(name, sysctls)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` with this thread in network namespace ``path`` (then back in its own): a socket
    it makes stays in ``path``'s namespace, a ``/proc/sys/net`` file it opens is that namespace's."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
        try:
            return fn()
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(fd)
        os.close(own)


def set_sysctls(netns: str, sysctls: dict[str, str]) -> None:
    """Write ``sysctls`` (dotted names) in namespace ``netns`` through ``/proc/sys`` (no process:
    the guest under TCG spawns slowly)."""

    def write() -> None:
        for k, v in sysctls.items():
            with open("/proc/sys/" + k.replace(".", "/"), "w") as f:
                f.write(v)

    in_netns(f"/run/netns/{netns}", write)


def del_netns(name: str) -> None:
    """Delete network namespace ``name`` if it exists."""
    run(["ip", "netns", "del", name])


@contextlib.contextmanager
def namespaces(names: list[str], sysctls: dict[str, str] | None = None) -> Iterator[None]:
    """Create the namespaces, delete every one of them on exit whatever happened."""
    try:
        for n in names:
            add_netns(n, sysctls)
        yield
    finally:
        for n in names:
            del_netns(n)


# -- the command corpus ---------------------------------------------------------------------------


def _argv(line: str, netns: str, case_dir: Path) -> list[str]:
    argv = shlex.split(line.replace("{dir}", str(case_dir)))
    if argv[0] == "ip":
        return ["ip", "-n", netns, *argv[1:]]
    return ["ip", "netns", "exec", netns, *argv]


def run_cases(plane: Plane, cases: list[Case], tag: str, on_case: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Run every case in a fresh namespace on ``plane``; returns one record per case:
    ``{"name", "commands": [{"cmd", "stdin", "plane", "rc", "stdout", "stderr", "seconds"}]}``
    (``on_case`` is given the records so far after each case)."""
    nodes = {f"c{i}": f"acf{tag}-{i}" for i in range(len(cases))}
    out: list[dict] = []
    with namespaces(list(nodes.values()), BASE_SYSCTLS):
        for ns in nodes.values():
            check(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(BASE_SETUP) + "\n")
        plane.start(nodes)
        try:
            for (node, ns), case in zip(nodes.items(), cases):
                print(f"case {case.name}", file=sys.stderr, flush=True)
                case_dir = WORK_DIR / case.name
                shutil.rmtree(case_dir, ignore_errors=True)
                case_dir.mkdir(parents=True)
                records = []
                for step in case.steps:
                    if step.file:
                        (case_dir / step.line).write_text(step.stdin or "")
                        continue
                    if step.plane is not None and step.plane != plane.name:
                        continue
                    argv = _argv(step.line, ns, case_dir)
                    t = time.monotonic()
                    r = run(argv, env=plane.env(node) if argv[1] == "-n" else None, stdin=step.stdin)
                    records.append({"cmd": step.line, "stdin": step.stdin, "plane": step.plane, "rc": r.returncode,
                                    "stdout": r.stdout, "stderr": r.stderr, "seconds": round(time.monotonic() - t, 3)})  # fmt: skip
                out.append({"name": case.name, "commands": records})
                if on_case is not None:
                    on_case(out)
                shutil.rmtree(case_dir, ignore_errors=True)
        finally:
            plane.stop()
    return out


def environment() -> dict[str, str]:
    """What the outputs depend on besides the data plane: kernel release, iproute2 version."""
    return {"kernel": platform.release(), "iproute2": run(["ip", "-V"]).stdout.strip(), "python": platform.python_version()}


def run_all(plane_name: str, *, only: list[str] | None = None, probes: bool = True,
            save: Callable[[dict], None] | None = None, probes_first: bool = False) -> dict:  # fmt: skip
    """Run the corpus (and the packet probes unless ``probes`` is false) on one data plane;
    returns the results document written by ``--out``. ``save`` is given the document as it
    grows (after each case, after the probes), so that a slow guest that runs out of time keeps
    what it did; ``probes_first`` runs the probes before the commands."""
    cases = load_corpus()
    if only:
        cases = [c for c in cases if c.name in only]
    tag = f"{os.getpid() % 100000}"
    doc: dict = {"plane": plane_name, "environment": environment(), "cases": [], "timing": {}}

    def grown(records: list[dict]) -> None:
        doc["cases"] = records
        if save is not None:
            save(doc)

    def run_probes() -> None:
        sys.path.insert(0, str(REPO))
        from conformance import probes as probes_mod

        t1 = time.monotonic()
        doc["probes"] = probes_mod.run_probes(make_plane(plane_name), tag)
        doc["timing"]["probes_s"] = round(time.monotonic() - t1, 2)
        if save is not None:
            save(doc)

    if probes and probes_first:
        run_probes()
    t0 = time.monotonic()
    doc["cases"] = run_cases(make_plane(plane_name), cases, tag, grown)
    doc["timing"]["commands_s"] = round(time.monotonic() - t0, 2)
    if probes and not probes_first:
        run_probes()
    return doc


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plane", choices=PLANES, required=True)
    ap.add_argument("--out", required=True, help="results file (JSON)")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--probes-first", action="store_true", help="run the packet probes before the commands")
    a = ap.parse_args(argv)
    def save(doc: dict, out: str = a.out) -> None:
        tmp = Path(out + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out)

    doc = run_all(a.plane, only=[x for x in a.only.split(",") if x] or None, probes=not a.no_probes,
                  save=lambda d: save(d, a.out + ".partial"), probes_first=a.probes_first)  # fmt: skip
    save(doc)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
