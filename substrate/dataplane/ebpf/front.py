"""The node's ``ip`` on the eBPF data plane: the real iproute2 with ``nlshim.so`` preloaded.

Inside a node, ``/usr/bin/ip`` (and so ``/bin/ip``, ``/sbin/ip``, ``/usr/sbin/ip``, which lead to it
on Debian) is a two-line wrapper bound over it that runs the host's real ``ip`` (bound at
``/run/anibench/ip``) with ``LD_PRELOAD=/run/anibench/nlshim.so``. iproute2 itself parses every
command and prints every answer and error; the shim only hands the SRv6 part of its netlink
conversation to the lab's data-plane service through ``/run/anibench/dataplane.sock``, the node's
own socket (see nlshim.c, service.py). So an agent, an operator and the substrate's own code
(every ``ip`` run in a node) go through one path.

Host-side code that runs ``ip -n NETNS`` for a node uses :func:`host_env`: the same shim, that
node's socket.

Files (per lab, ``<lab dir>/dataplane/node-files/``, bound read-only at ``/run/anibench`` in every
node): ``nlshim.so``, ``ip-front`` (the wrapper), and the empty mount points ``ip`` and
``dataplane.sock``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from substrate.dataplane.ebpf import build

SHIM_SRC = Path(__file__).resolve().parent / "nlshim.c"
#: Where a node sees the files.
NODE_DIR = "/run/anibench"
REAL_IP = "/usr/bin/ip"
FILES = "dataplane/node-files"
WRAPPER = f"""#!/bin/sh
# anibench: the real iproute2, its SRv6 netlink requests served by the lab's eBPF data plane
LD_PRELOAD={NODE_DIR}/nlshim.so exec {NODE_DIR}/ip "$@"
"""


def build_shim() -> Path:
    """Compile ``nlshim.c`` (gcc -O2 -shared -fPIC) into the build directory if its source changed.

    Raises:
        EnvironmentProblem: gcc missing or the compilation failed.
    """
    digest = hashlib.sha256(SHIM_SRC.read_bytes()).hexdigest()
    return build.compile_once("nlshim.so", digest, lambda tmp: ["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", tmp,
                                                                 str(SHIM_SRC), "-ldl"], "the netlink shim (nlshim.c)")  # fmt: skip


def prepare_lab(lab_dir: Path) -> Path:
    """Write the lab's node files (see the module docstring); returns their directory."""
    d = lab_dir / FILES
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(build_shim(), d / "nlshim.so")
    os.chmod(d / "nlshim.so", 0o755)
    (d / "ip-front").write_text(WRAPPER)
    os.chmod(d / "ip-front", 0o755)
    for mp in ("ip", "dataplane.sock"):
        (d / mp).touch()
    return d


def node_config(lab_dir: Path, node: str) -> dict[str, str]:
    """What ``node_init.py`` needs to give ``node`` its ``ip`` front (``cfg["dataplane"]``)."""
    from substrate.dataplane.ebpf.service import socket_path

    return {"files": str(lab_dir / FILES), "socket": str(socket_path(lab_dir, node)), "real_ip": REAL_IP}


def host_env(lab_dir: Path, node: str) -> dict[str, str]:
    """Environment for a host-side ``ip -n NETNS`` acting on ``node``: the shim, the node's socket."""
    from substrate.dataplane.ebpf.service import socket_path

    return {**os.environ, "LD_PRELOAD": str(lab_dir / FILES / "nlshim.so"), "ANIBENCH_DP_SOCKET": str(socket_path(lab_dir, node))}
