"""Compile the eBPF programs of the SRv6 data plane (``bpf/*.c``) into BPF objects.

Each ``bpf/NAME.c`` becomes ``<build dir>/NAME.o`` with ``clang -O2 -g -target bpf`` (BTF
included, which libbpf needs for the ``const volatile`` .rodata configuration). The build
directory is outside git: ``$ANIBENCH_BPF_BUILD`` if set, else ``/var/lib/anibench/bpf``.

An object is rebuilt only when its inputs changed: a stamp file ``NAME.o.sha256`` holds the
SHA-256 of the source, of every header in ``bpf/`` and of the compiler command line; a
different digest (or a missing object) triggers a rebuild. The object is written to a temporary
name and renamed, so a concurrent loader never sees a half-written file.

Verified with Debian clang 14.0.6 and libbpf-dev 1.1.2 headers (Debian 12).

Run ``python -m substrate.dataplane.ebpf.build`` to build everything (prints one line per
object, exit code 1 when a compilation failed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
import os
import subprocess
import sys
from pathlib import Path

from substrate.errors import EnvironmentProblem

#: Directory of the C sources.
SRC_DIR = Path(__file__).resolve().parent / "bpf"
#: Environment variable that overrides the build directory.
ENV = "ANIBENCH_BPF_BUILD"
DEFAULT_BUILD_DIR = Path("/var/lib/anibench/bpf")
CLANG = os.environ.get("ANIBENCH_CLANG", "clang")


def build_dir() -> Path:
    """The directory the objects are written to (not created here)."""
    return Path(os.environ.get(ENV) or DEFAULT_BUILD_DIR)


def _cflags() -> list[str]:
    arch_inc = f"/usr/include/{os.uname().machine}-linux-gnu"
    flags = ["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-Wno-unused-function", f"-I{SRC_DIR}"]
    if Path(arch_inc).is_dir():
        flags.append(f"-I{arch_inc}")
    return flags


def _digest(src: Path) -> str:
    h = hashlib.sha256()
    h.update(" ".join([CLANG, *_cflags()]).encode())
    for p in [src, *sorted(SRC_DIR.glob("*.h"))]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def sources() -> list[Path]:
    """Every ``bpf/*.c`` source."""
    return sorted(SRC_DIR.glob("*.c"))


def build(name: str, *, force: bool = False) -> Path:
    """Build ``bpf/NAME.c`` if needed and return the path of ``NAME.o``.

    Raises:
        FileNotFoundError: no such source.
        EnvironmentProblem: clang is missing, or the compilation failed (message holds clang's
            diagnostics).
    """
    src = SRC_DIR / f"{name}.c"
    if not src.is_file():
        raise FileNotFoundError(f"no BPF source {src}")
    return compile_once(f"{name}.o", _digest(src), lambda tmp: [CLANG, *_cflags(), "-c", str(src), "-o", tmp],
                        f"eBPF programs ({src.name})", force=force)  # fmt: skip


def compile_once(name: str, digest: str, command: Callable[[str], list[str]], what: str, *, force: bool = False) -> Path:
    """``<build dir>/name``, (re)built by ``command(temporary output path)`` only when ``digest``
    (of everything that goes into it) differs from the one stamped beside it (``name.sha256``).
    Written to a temporary name and renamed, so a concurrent reader never sees half a file.

    Raises:
        EnvironmentProblem: the compiler is missing, or it failed (its diagnostics in the message).
    """
    out_dir = build_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    out, stamp = out_dir / name, out_dir / f"{name}.sha256"
    if not force and out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    tmp = out_dir / f".{name}.{os.getpid()}"
    cmd = command(str(tmp))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise EnvironmentProblem(f"cannot build {what}: {cmd[0]} not found (install it: ./install.sh)") from e
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EnvironmentProblem(f"{cmd[0]} failed on {what}:\n{res.stderr.strip()}")
    os.replace(tmp, out)
    stamp.write_text(digest + "\n")
    return out


def build_all(*, force: bool = False) -> dict[str, Path]:
    """Build every source; returns ``{name: object path}``. Raises like :func:`build`."""
    return {src.stem: build(src.stem, force=force) for src in sources()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    force = "--force" in args
    rc = 0
    for src in sources():
        try:
            print(f"{src.stem}: {build(src.stem, force=force)}")
        except EnvironmentProblem as e:
            print(f"{src.stem}: FAILED: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
