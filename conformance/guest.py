"""A qemu guest with the kernel's own seg6: Debian's stock cloud kernel under TCG, the host's root
file system shared read-only (issue 34, "Conformance against the kernel itself").

Where the host kernel has no seg6 (CONFIG_IPV6_SEG6_LWTUNNEL off, as on the CI machines), the
kernel side of the conformance suite runs here: ``qemu-system-x86_64`` with software emulation
(TCG, multi-threaded; KVM on these machines is PVM-only) boots ``linux-image-cloud-amd64`` from
Debian (6.1 for bookworm: ``CONFIG_IPV6_SEG6_LWTUNNEL=y``, ``CONFIG_NET_VRF=m``, virtio-fs as a
module), whose root is the host's ``/`` through virtiofsd (``/usr/lib/qemu/virtiofsd`` of
qemu-system-common, ``sandbox=chroot``: its namespace sandbox cannot pivot_root into ``/``),
mounted read-only, with tmpfs on ``/run``, ``/tmp`` and ``/var/tmp`` (``HOME`` is ``/tmp/home``;
``/root`` stays the host's, read-only: the venv's Python may live there). The guest
kernel's modules (``dpkg-deb -x`` of the package, ``depmod``, kept in :data:`CACHE`) are found by
a ``modprobe -d`` wrapper set as ``/proc/sys/kernel/modprobe``, so that module autoloading (vrf,
veth, bridge, nf_tables ...) works with the host's ``/usr/lib/modules`` absent or another's. So the guest runs the host's very ``ip``, Python, FRR and this
repository. A second virtio-fs share, read-write, is the guest's ``/run/guest-out`` (the host's
``out`` directory): results and the guest's log go there.

The initramfs is made here (newc cpio written by Python): the static busybox of
``busybox-static``, the virtio and virtio-fs modules, and an ``/init`` that mounts the shares and
``switch_root``\\ s into the host's tree, where ``/bin/sh`` runs the given script and powers the
guest off (``/proc/sysrq-trigger``).

Host packages: ``qemu-system-x86`` (qemu and virtiofsd), ``busybox-static``; the kernel package
is fetched with ``apt-get download`` (ordinary apt). :func:`missing` says what is not there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Where the extracted guest kernel lives (outside the repository: 90 MiB of modules).
CACHE = Path(os.environ.get("ANIBENCH_GUEST_CACHE", "/var/cache/anibench-conformance"))
KERNEL_PACKAGE = "linux-image-cloud-amd64"
QEMU = "qemu-system-x86_64"
VIRTIOFSD = "/usr/lib/qemu/virtiofsd"
BUSYBOX = "/bin/busybox"
#: Modules the initramfs loads (with their dependencies, from modules.dep) to mount virtio-fs.
INITRD_MODULES = ("kernel/drivers/virtio/virtio_pci.ko", "kernel/fs/fuse/virtiofs.ko")
GUEST_OUT = "/run/guest-out"
MEMORY_MIB = 2048
SOCKET_WAIT_S = 30.0

INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /newroot /bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.list); do insmod /modules/$m || echo "insmod $m failed"; done
mount -t virtiofs root /newroot -o ro || { echo "cannot mount the root share"; echo o > /proc/sysrq-trigger; }
for d in run tmp var/tmp; do mount -t tmpfs -o mode=0755,size=512m tmpfs /newroot/$d; done
chmod 1777 /newroot/tmp /newroot/var/tmp
mkdir -p /newroot/run/guest-out /newroot/run/lock
mount -t virtiofs out /newroot/run/guest-out
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh -c '
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
printf "#!/bin/sh\nexec /sbin/modprobe -d @KERNEL_DIR@ \"\$@\"\n" > /run/modprobe
chmod 755 /run/modprobe
echo /run/modprobe > /proc/sys/kernel/modprobe
ip link set lo up
hostname guest
echo "guest-up $(cut -d" " -f1 /proc/uptime)" > /run/guest-out/uptime
mkdir -p /tmp/home; export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp/home LANG=C.UTF-8
/bin/sh /run/guest-out/cmd.sh > /run/guest-out/log 2>&1
echo "$?" > /run/guest-out/status
sync
echo o > /proc/sysrq-trigger
sleep 60'
"""


def kernel_dir() -> Path:
    """The extracted kernel package (``boot/``, ``lib/modules/``)."""
    return CACHE / "kernel"


def kernel_release() -> str | None:
    """The guest kernel's release (``6.1.0-NN-cloud-amd64``) if extracted, else None."""
    d = kernel_dir() / "lib" / "modules"
    rel = sorted(p.name for p in d.iterdir()) if d.is_dir() else []
    return rel[-1] if rel and (kernel_dir() / "boot" / f"vmlinuz-{rel[-1]}").exists() else None


def missing() -> list[str]:
    """What the guest needs and this host lacks (host programs; the kernel is fetched on demand)."""
    out = []
    if not shutil.which(QEMU):
        out.append(f"{QEMU} (apt: qemu-system-x86)")
    if not os.access(VIRTIOFSD, os.X_OK):
        out.append(f"{VIRTIOFSD} (apt: qemu-system-x86)")
    if not os.access(BUSYBOX, os.X_OK) or not _static_hint():
        out.append(f"{BUSYBOX} statically linked (apt: busybox-static)")
    return out


def _static_hint() -> str:
    """"statically" when :data:`BUSYBOX` is a static ELF (no PT_INTERP program header), else ""."""
    try:
        data = Path(BUSYBOX).read_bytes()[:4096]
    except OSError:
        return ""
    import struct

    if data[:4] != b"\x7fELF" or data[4] != 2:
        return ""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + 4 <= len(data) and struct.unpack_from("<I", data, off)[0] == 3:  # PT_INTERP
            return ""
    return "statically"


def fetch_kernel() -> str:
    """Download (``apt-get download``) and extract Debian's cloud kernel into :data:`CACHE` if it
    is not there; run ``depmod`` on it. Returns its release.

    Raises:
        RuntimeError: apt or dpkg-deb failed.
    """
    rel = kernel_release()
    if rel:
        return rel
    CACHE.mkdir(parents=True, exist_ok=True)
    dl = CACHE / "download"
    dl.mkdir(exist_ok=True)
    dep = subprocess.run(["apt-cache", "depends", KERNEL_PACKAGE], capture_output=True, text=True).stdout
    names = [w.split()[-1] for w in dep.splitlines() if "Depends: linux-image-" in w]
    if not names:
        raise RuntimeError(f"apt does not know {KERNEL_PACKAGE} (apt-get update?)")
    r = subprocess.run(["apt-get", "download", names[0]], cwd=dl, capture_output=True, text=True)
    debs = sorted(dl.glob(f"{names[0]}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {names[0]} failed: {r.stderr.strip()[-300:]}")
    tmp = Path(tempfile.mkdtemp(dir=CACHE))
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tmp)], check=True)
    (rel,) = [p.name for p in (tmp / "lib" / "modules").iterdir()]
    subprocess.run(["depmod", "-b", str(tmp), rel], check=True)
    shutil.rmtree(kernel_dir(), ignore_errors=True)
    tmp.rename(kernel_dir())
    shutil.rmtree(dl, ignore_errors=True)
    return rel


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, content) entries (directories: empty content)."""
    out = bytearray()
    ino = 1
    for name, mode, data in [*entries, ("TRAILER!!!", 0, b"")]:
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{x:08x}" for x in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out += hdr.encode() + nb
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
        ino += 1
    return bytes(out)


def module_order(mods: Path, targets: tuple[str, ...]) -> list[str]:
    """``targets`` and their dependencies (``modules.dep``), each after what it needs."""
    deps: dict[str, list[str]] = {}
    for line in (mods / "modules.dep").read_text().splitlines():
        name, _, rest = line.partition(":")
        deps[name] = rest.split()
    out: list[str] = []
    for t in targets:
        for m in [*reversed(deps.get(t, [])), t]:
            if m not in out:
                out.append(m)
    return out


def build_initrd(dest: Path, release: str) -> Path:
    """Write the initramfs (busybox, virtio-fs modules, /init) to ``dest``."""
    mods = kernel_dir() / "lib" / "modules" / release
    entries: list[tuple[str, int, bytes]] = [("bin", stat.S_IFDIR | 0o755, b""), ("modules", stat.S_IFDIR | 0o755, b"")]
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, Path(BUSYBOX).read_bytes()))
    names = []
    for m in module_order(mods, INITRD_MODULES):
        base = Path(m).name
        entries.append((f"modules/{base}", stat.S_IFREG | 0o644, (mods / m).read_bytes()))
        names.append(base)
    entries.append(("modules.list", stat.S_IFREG | 0o644, ("\n".join(names) + "\n").encode()))
    init = INIT.replace("@KERNEL_DIR@", str(kernel_dir()))
    entries.append(("init", stat.S_IFREG | 0o755, init.encode()))
    dest.write_bytes(_cpio(entries))
    return dest


@dataclass
class GuestRun:
    """What a guest run gave.

    Attributes:
        status: the script's exit status (None: the guest never said: crashed or timed out).
        seconds: wall time from starting qemu to its exit.
        boot_seconds: guest uptime when the script started (the boot).
        log: the script's stdout and stderr.
        console: the guest's serial console (kernel messages, init's own).
        out: the shared output directory (results files the script wrote).
    """

    status: int | None
    seconds: float
    boot_seconds: float | None
    log: str
    console: str
    out: Path


@contextlib.contextmanager
def _virtiofsd(source: str, sock: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as err:
        p = subprocess.Popen([VIRTIOFSD, f"--socket-path={sock}", "-o", f"source={source}", "-o", "cache=auto",
                              "-o", "no_posix_lock", "-o", "allow_root", "-o", "sandbox=chroot"], stdin=subprocess.DEVNULL,
                             stdout=err, stderr=err)  # fmt: skip
    try:
        deadline = time.monotonic() + SOCKET_WAIT_S
        while not sock.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not sock.exists():
            raise RuntimeError(f"virtiofsd for {source} did not start: {log.read_text(errors='replace')[-300:]}")
        yield p
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def run(script: str, *, out: Path, timeout_s: float = 1800.0, cpus: int = 2, memory_mib: int = MEMORY_MIB) -> GuestRun:
    """Boot the guest, run ``script`` (``/bin/sh``, from the host's tree, with ``$OUT`` the shared
    output directory ``/run/guest-out``) and power off. Returns when qemu exits, or kills it
    after ``timeout_s``.

    Raises:
        RuntimeError: a host program is missing (see :func:`missing`), or virtiofsd did not start.
    """
    lack = missing()
    if lack:
        raise RuntimeError("the kernel guest needs: " + ", ".join(lack))
    release = fetch_kernel()
    out.mkdir(parents=True, exist_ok=True)
    for f in ("status", "log", "uptime"):
        with contextlib.suppress(FileNotFoundError):
            (out / f).unlink()
    (out / "cmd.sh").write_text(f"OUT={GUEST_OUT}\nexport OUT\n{script}\n")
    work = Path(tempfile.mkdtemp(prefix="anibench-guest-"))
    try:
        initrd = build_initrd(work / "initrd.cpio", release)
        console = work / "console.log"
        t0 = time.monotonic()
        with _virtiofsd("/", work / "root.sock", work / "virtiofsd-root.log"), \
                _virtiofsd(str(out), work / "out.sock", work / "virtiofsd-out.log"):  # fmt: skip
            argv = [QEMU, "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
                    "-smp", str(cpus), "-m", f"{memory_mib}M",
                    "-object", f"memory-backend-memfd,id=mem,size={memory_mib}M,share=on", "-numa", "node,memdev=mem",
                    "-kernel", str(kernel_dir() / "boot" / f"vmlinuz-{release}"), "-initrd", str(initrd),
                    "-append", "console=ttyS0 quiet panic=-1 rdinit=/init",
                    "-chardev", f"socket,id=fs0,path={work / 'root.sock'}",
                    "-device", "vhost-user-fs-pci,chardev=fs0,tag=root",
                    "-chardev", f"socket,id=fs1,path={work / 'out.sock'}",
                    "-device", "vhost-user-fs-pci,chardev=fs1,tag=out",
                    "-nodefaults", "-display", "none", "-no-reboot", "-serial", f"file:{console}"]  # fmt: skip
            q = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                qout, _ = q.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                q.kill()
                qout, _ = q.communicate()
        seconds = time.monotonic() - t0
        text = console.read_text(errors="replace") if console.exists() else ""
        text += qout.decode(errors="replace")
        status = None
        with contextlib.suppress(OSError, ValueError):
            status = int((out / "status").read_text().strip())
        boot = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            boot = float((out / "uptime").read_text().split()[1])
        log = (out / "log").read_text(errors="replace") if (out / "log").exists() else ""
        return GuestRun(status, round(seconds, 2), boot, log, text, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
