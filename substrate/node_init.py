"""Init of one anibench node (netns backend). Standalone: imports nothing from the project.

Started by the backend as::

    setsid --fork nsenter --net=/run/netns/NS \\
        unshare --mount --pid --uts --ipc --fork --propagation private \\
        python3 -S -I node_init.py NODE_DIR HOSTNAME ROLE

so it runs as PID 1 of a fresh PID namespace, in a private mount namespace, inside the node's
network namespace. In order, it

1. sets the node's sysctls, before any link exists, so that duplicate address detection is off
   on every interface the node will get (shared/notes/substrate.md: with DAD on, packets queue
   for ~2 s), and turns forwarding on for routers;
2. builds a minimal root and pivots into it::

       /usr, /etc         read-only binds of the host's (/etc/shadow, /etc/gshadow masked)
       /etc/frr           the node's own directory (NODE_DIR/etc-frr), writable
       /etc/hostname      the node's own file
       /run, /tmp, /var   private tmpfs (so /var/run/frr, /var/log/frr are the node's)
       /dev               tmpfs with null, zero, full, random, urandom, tty only
       /proc              this PID namespace's proc; /proc/sys read-only except /proc/sys/net
       /sys               sysfs of this network namespace, read-only

   Nothing else of the host (its /root, /home, /tmp, the project, anibench's run directories)
   is reachable from the node;
3. prints ``ready <pid>`` (its PID as the host sees it) and becomes ``sleep infinity`` with
   SIGCHLD ignored, so orphaned daemons are reaped by the kernel. PID 1 of a PID namespace
   ignores signals it has no handler for, so only SIGKILL from outside stops it.

All mounts are direct system calls (ctypes): about 5x faster than a shell script forking
``mount`` thirty times, which matters when forty nodes start at once on two cores.
"""

import ctypes
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype=None, flags=0, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def bind(src, target, readonly=False, recursive=False):
    mount(src, target, None, MS_BIND | (MS_REC if recursive else 0))
    if readonly:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def sysctl(key, value):
    with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
        f.write(str(value))


def main():
    node_dir, hostname, role = sys.argv[1:4]
    host_pid = int(os.readlink("/proc/self"))  # /proc is still the host's: the host-side PID
    for k in ("all", "default"):
        for key, val in (
            (f"net.ipv6.conf.{k}.accept_dad", 0),
            (f"net.ipv6.conf.{k}.dad_transmits", 0),
            (f"net.ipv6.conf.{k}.seg6_enabled", 1),
            (f"net.ipv6.conf.{k}.keep_addr_on_down", 1),
            (f"net.ipv6.conf.{k}.accept_ra", 0),
            (f"net.ipv4.conf.{k}.rp_filter", 0),
        ):
            sysctl(key, val)
    sysctl("net.ipv6.icmp.ratelimit", 0)
    sysctl("net.ipv4.icmp_ratelimit", 0)
    if role != "host":
        sysctl("net.ipv6.conf.all.forwarding", 1)
        sysctl("net.ipv4.ip_forward", 1)
        # run netfilter (conntrack, NAT) on packets SRv6 decapsulates, so floating-IP NAT sees
        # replies that arrive through End.DX4 (kernel doc: nf_conntrack-sysctl, nf_hooks_lwtunnel)
        try:
            sysctl("net.netfilter.nf_hooks_lwtunnel", 1)
        except OSError:
            pass
    sysctl("kernel.hostname", hostname)

    root = os.path.join(node_dir, "root")
    os.makedirs(root, exist_ok=True)
    mount("anibench-node", root, "tmpfs", MS_NOSUID, "mode=755")
    os.chdir(root)
    for d in ("usr", "etc", "proc", "sys", "dev", "tmp", "run", "var", "root"):
        os.mkdir(d)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if os.path.exists("/" + link):
            os.symlink(target, link)
    bind("/usr", "usr", readonly=True, recursive=True)
    bind("/etc", "etc", readonly=True)
    bind(os.path.join(node_dir, "etc-frr"), "etc/frr")
    with open(os.path.join(node_dir, "hostname"), "w") as f:
        f.write(hostname + "\n")
    if os.path.exists("etc/hostname"):
        bind(os.path.join(node_dir, "hostname"), "etc/hostname")
    for f in ("shadow", "gshadow", "shadow-", "gshadow-"):
        if os.path.exists("etc/" + f):
            bind("/dev/null", "etc/" + f)
    mount("tmp", "tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    mount("run", "run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    mount("var", "var", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    import pwd

    frr = pwd.getpwnam("frr")
    for d in ("run/frr", "var/lib/frr", "var/log/frr", "var/tmp"):
        os.makedirs(d)
        if d != "var/tmp":
            os.chown(d, frr.pw_uid, frr.pw_gid)
    os.chmod("var/tmp", 0o1777)
    os.symlink("/run", "var/run")
    mount("dev", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755")
    for d in ("null", "zero", "full", "random", "urandom", "tty"):
        open("dev/" + d, "w").close()
        bind("/dev/" + d, "dev/" + d)
    os.mkdir("dev/pts")
    os.mkdir("dev/shm")
    mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, "dev/" + name)
    mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    bind("proc/sys", "proc/sys")
    bind("proc/sys/net", "proc/sys/net")
    mount(None, "proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.mkdir(".old")
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pivot_root: unsupported machine {os.uname().machine}")
    _check(_libc.syscall(nr, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    # lo up: done by the backend's first `ip -n` batch; nothing else here needs the network.
    sys.stdout.write(f"ready {host_pid}\n")
    sys.stdout.flush()
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    os.execv("/usr/bin/sleep", ["sleep", "infinity"])


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure on stderr, exit non-zero
        sys.stderr.write(f"node init failed: {e}\n")
        sys.exit(1)
