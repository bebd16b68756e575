"""Init of one anibench node (netns backend). Standalone: imports nothing from the project.

Started by the backend as ``setsid --fork python3 -S -I node_init.py CONFIG`` (CONFIG: one JSON
object, see ``NetnsBackend._init_config``). It runs as root of the host and, in order,

1. joins the node's cgroups (so every process of the node is counted against its limits) and
   mounts a size-limited tmpfs on the node's ``etc-frr`` directory (host side: the host writes
   the node's FRR files there);
2. creates the node's namespaces: a helper child unshares a new **user** namespace together with
   new network, UTS, IPC and cgroup namespaces, which that user namespace therefore owns; this
   process maps it (uid and gid 0..2^32-2 onto the same host ids) and joins all of them but the
   user namespace, keeping its host privileges for the set-up;
3. sets the node's sysctls, before any link exists, so that duplicate address detection is off
   on every interface the node will get (shared/notes/substrate.md: with DAD on, packets queue
   for ~2 s), and turns forwarding on for routers; sets the hostname;
4. creates the node's **mount** namespace, owned by the host's user namespace (so nothing in
   the node can ever mount or unmount: the masks below hold even against root with every
   capability of the node's user namespace), and builds a minimal root::

       /                  tmpfs, read-only once built
       /usr               read-only bind of the host's
       /etc               read-only bind of the lab's allowlisted copy (confine.ETC_ALLOWLIST)
       /etc/frr           the node's own (NODE_DIR/etc-frr, a size-limited tmpfs), writable
       /etc/hostname      the node's own file, read-only
       /tmp /run /var /root /dev/shm   private tmpfs, each with a size limit
       /run/anibench      on the eBPF data plane only: the real ip, the netlink shim and the
                          node's data-plane socket, read-only; /usr/bin/ip is the wrapper
                          (substrate/dataplane/ebpf/front.py)
       /dev               null, zero, full, random, urandom, tty only
       /proc              the node's PID namespace's proc; masked and read-only entries as
                          container runtimes have them; /proc/sys read-only but for /proc/sys/net
       /sys               sysfs of the node's network namespace, read-only, with masks

   Nothing else of the host (its /root, /home, /tmp, the project, anibench's run directories,
   the rest of its /etc) is reachable from the node;
5. creates the node's **PID** namespace (also owned by the host's user namespace: nothing in the
   node may reboot(2) it or enter it) and forks its PID 1, which mounts /proc, pivots into the
   root, joins the node's user namespace (becoming root of that namespace only), forbids nested
   user namespaces in it (``user.max_user_namespaces`` = 0 is per user namespace), and becomes
   ``sleep infinity`` with SIGCHLD ignored, so orphaned daemons are reaped by the kernel. PID 1 of
   a PID namespace ignores signals it has no handler for, so only SIGKILL from outside stops it;
6. masks /proc (this process shares the node's mount namespace and is still the host's root)
   and remounts the node's root read-only.

This process prints ``ready <pid>`` (PID 1's host PID) and exits. The backend then names the
network namespace (``ip netns attach``) and enters the node with ``nsenter --user ...``.

All mounts are direct system calls (ctypes): about 5x faster than a shell script forking
``mount`` thirty times, which matters when forty nodes start at once on two cores.
"""

import ctypes
import json
import os
import pwd
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
#: uid_map / gid_map of a node's user namespace: every id onto the same host id (root is root
#: of the node's namespaces only: capabilities are relative to the namespace that owns a resource).
ID_MAP = "0 0 4294967295\n"

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
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | (MS_REC if recursive else 0))


def tmpfs(target, size, mode="755", flags=MS_NOSUID | MS_NODEV):
    mount("anibench", target, "tmpfs", flags, f"size={size},mode={mode}")


def sysctl(key, value):
    with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
        f.write(str(value))


def setns(fd, nstype):
    _check(_libc.setns(fd, nstype), f"setns {nstype:#x}")


def new_namespaces():
    """A user namespace and the network, UTS, IPC and cgroup namespaces it owns, made by a
    helper child (unshare moves its caller into the new user namespace; this process must stay
    root of the host to build the node). Returns open descriptors of each, by /proc/PID/ns name."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            rc = _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP)
            os.write(ready_w, b"0" if rc == 0 else str(ctypes.get_errno()).encode())
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        answer = os.read(ready_r, 16)
        if answer != b"0":
            err = int(answer or b"0") or 1
            raise OSError(err, f"unshare of the node's namespaces: {os.strerror(err)}")
        for f in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{f}", "w") as fh:
                fh.write(ID_MAP)
        return {k: os.open(f"/proc/{pid}/ns/{k}", os.O_RDONLY)
                for k in ("user", "net", "uts", "ipc", "cgroup")}  # fmt: skip
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)


def set_sysctls(role, hostname):
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


def build_root(cfg, frr):
    """Mount everything of the node's root but /proc (which needs the node's PID namespace);
    the current directory is the root afterwards."""
    node_dir, sizes = cfg["node_dir"], cfg["tmpfs"]
    root = os.path.join(node_dir, "root")
    os.makedirs(root, exist_ok=True)
    tmpfs(root, "1m", flags=MS_NOSUID)
    os.chdir(root)
    for d in ("usr", "etc", "proc", "sys", "dev", "tmp", "run", "var", "root", ".old"):
        os.mkdir(d)
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + link):
            os.symlink(os.readlink("/" + link).lstrip("/"), link)
    bind("/usr", "usr", readonly=True, recursive=True)
    bind(cfg["etc"], "etc", readonly=True)
    bind(cfg["etc_frr"], "etc/frr")
    hostname_file = os.path.join(node_dir, "hostname")
    with open(hostname_file, "w") as f:
        f.write(cfg["hostname"] + "\n")
    bind(hostname_file, "etc/hostname", readonly=True)
    for d, size in sizes.items():
        if d == "dev/shm":
            continue
        tmpfs(d, size, mode="1777" if d == "tmp" else "700" if d == "root" else "755")
    for d in ("run/frr", "var/lib/frr", "var/log/frr", "var/tmp"):
        os.makedirs(d)
        if d != "var/tmp":
            os.chown(d, frr.pw_uid, frr.pw_gid)
    os.chmod("var/tmp", 0o1777)
    os.symlink("/run", "var/run")
    dp = cfg.get("dataplane")
    if dp:  # the eBPF SRv6 data plane: the node's ip is the real one with the netlink shim (ebpf/front.py)
        os.makedirs("run/anibench")
        bind(dp["files"], "run/anibench", readonly=True)
        bind(dp["real_ip"], "run/anibench/ip", readonly=True)
        bind(dp["socket"], "run/anibench/dataplane.sock")
        bind(os.path.join(dp["files"], "ip-front"), dp["real_ip"].lstrip("/"), readonly=True)
    tmpfs("dev", "64k", flags=MS_NOSUID | MS_NOEXEC)
    for d in ("null", "zero", "full", "random", "urandom", "tty"):
        open("dev/" + d, "w").close()
        bind("/dev/" + d, "dev/" + d)
    os.mkdir("dev/pts")
    os.mkdir("dev/shm")
    tmpfs("dev/shm", sizes["dev/shm"], mode="1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, "dev/" + name)
    # sysfs shows the network namespace of whoever mounts it: this process is in the node's
    mount("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for p in cfg["sys_masked"]:
        mask(os.path.join("sys", p))


def mask(path, devnull="dev/null"):
    """Hide ``path``: ``devnull`` bound over a file, an empty read-only tmpfs over a directory; a
    path that does not exist is skipped."""
    if os.path.isdir(path) and not os.path.islink(path):
        mount("anibench-mask", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0,mode=555")
    elif os.path.exists(path):
        bind(devnull, path, readonly=True)


def init_main(user_fd, ready_w):
    """PID 1 of the node: /proc, pivot, join the node's user namespace and forbid nested ones,
    tell the parent (which masks /proc next), wait forever."""
    mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pivot_root: unsupported machine {os.uname().machine}")
    _check(_libc.syscall(nr, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    setns(user_fd, CLONE_NEWUSER)
    os.close(user_fd)
    # the node's user namespace may have no nested one (an unprivileged command could otherwise
    # gain every capability over namespaces of its own making); this sysctl is per user namespace
    sysctl("user.max_user_namespaces", 0)
    os.write(ready_w, b"1")
    os.close(ready_w)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    os.execv("/usr/bin/sleep", ["sleep", "infinity"])


def mask_proc(cfg):
    """Masked and read-only /proc entries (this process's root is the node's now)."""
    for p in cfg["proc_masked"]:
        mask(os.path.join("/proc", p), "/dev/null")
    for p in cfg["proc_readonly"]:
        path = os.path.join("/proc", p)
        if not os.path.exists(path):
            continue
        bind(path, path)
        if p == "sys":  # /proc/sys/net keeps a writable mount of its own: the node's network namespace's
            bind("/proc/sys/net", "/proc/sys/net")
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def main():
    cfg = json.loads(sys.argv[1])
    for f in cfg["cgroup_procs"]:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    frr = pwd.getpwnam("frr")
    tmpfs(cfg["etc_frr"], cfg["etc_frr_size"], flags=MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chown(cfg["etc_frr"], frr.pw_uid, frr.pw_gid)
    ns = new_namespaces()
    for kind, nstype in (("net", CLONE_NEWNET), ("uts", CLONE_NEWUTS), ("ipc", CLONE_NEWIPC), ("cgroup", CLONE_NEWCGROUP)):
        setns(ns.pop(kind), nstype)
    set_sysctls(cfg["role"], cfg["hostname"])
    _check(_libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    build_root(cfg, frr)
    _check(_libc.unshare(CLONE_NEWPID), "unshare PID namespace")
    ready_r, ready_w = os.pipe()
    pid = os.fork()  # the first process of the node's PID namespace: its PID 1
    if pid == 0:
        os.close(ready_r)
        try:
            init_main(ns["user"], ready_w)
        except Exception as e:  # noqa: BLE001 - report any failure on stderr, exit non-zero
            sys.stderr.write(f"node init failed: {e}\n")
        os._exit(1)
    os.close(ready_w)
    if os.read(ready_r, 1) != b"1":
        os.waitpid(pid, 0)
        sys.exit(1)  # PID 1 said why on stderr
    mask_proc(cfg)
    sys.stdout.write(f"ready {pid}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure on stderr, exit non-zero
        sys.stderr.write(f"node init failed: {e}\n")
        sys.exit(1)
