"""SSH keys and the runtime directory of a lab's NETCONF server (``<lab dir>/netconf``, host side,
never visible inside a node)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The SSH user of every NETCONF endpoint.
USER = "netconf"


def server_dir(lab: Any) -> Path:
    """``<lab dir>/netconf`` (created, mode 0700; never the lab directory itself: a lab being
    destroyed is not brought back by a late caller).

    Raises:
        FileNotFoundError: the lab directory is gone.
    """
    d = Path(lab.dir) / "netconf"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def ensure_keys(d: Path) -> tuple[Path, Path]:
    """The lab's SSH host key and client key (ed25519, OpenSSH format, mode 0600), made on first
    use. Returns (host key path, client key path); the client's public key is beside it (.pub)."""
    import asyncssh

    out = []
    for name in ("ssh_host_key", "client_key"):
        p = d / name
        if not p.exists():
            key = asyncssh.generate_private_key("ssh-ed25519", comment=f"anibench-{name}")
            tmp = d / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.export_private_key("openssh"))
            (d / f"{name}.pub").write_bytes(key.export_public_key("openssh"))
            os.replace(tmp, p)
        out.append(p)
    return out[0], out[1]
