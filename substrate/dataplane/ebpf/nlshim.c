/* nlshim.c -- the netlink side of a node's `ip` on the eBPF SRv6 data plane (anibench, issue 34).
 *
 * Preloaded (LD_PRELOAD) into the node's real iproute2 `ip` by the node's `ip` wrapper. On a kernel
 * without seg6 (CONFIG_IPV6_SEG6_LWTUNNEL unset) the kernel refuses `encap seg6|seg6local` routes
 * and has no "SEG6" generic netlink family. This shim lets iproute2 itself parse every command,
 * print every result and every error, and only moves the SRv6 part of its netlink conversation to
 * the lab's data-plane service (substrate/dataplane/ebpf/service.py), over the node's own Unix
 * socket (SOCK_SEQPACKET at $ANIBENCH_DP_SOCKET, default /run/anibench/dataplane.sock):
 *
 *   - a request datagram holding an RTM_NEWROUTE/RTM_DELROUTE with RTA_ENCAP_TYPE seg6 (5) or
 *     seg6local (7), or a generic netlink CTRL_CMD_GETFAMILY for "SEG6" or a message of the family
 *     id the service handed out, goes to the service ('S'); the datagrams the service answers
 *     (acks, errors, replies, as the kernel would send them) are what the next receive returns;
 *   - a datagram received from the kernel that holds a route with an LWT BPF program named
 *     "anibench:..." (the eBPF data plane's SRv6 routes) goes to the service ('R'), which returns
 *     it with that route shown as the kernel's seg6/seg6local would show it.
 *
 * Everything else goes to the kernel untouched. Wire format to the service, one datagram each way:
 *   request:  op (1 byte, 'S' or 'R'), netlink protocol (1 byte), reserved (2 bytes),
 *             the socket's netlink port id (u32, host order), then the netlink datagram;
 *   answer:   count (u32), then count x [length (u32), datagram].
 * When the service cannot be reached, an SRv6 change fails with errno ECONNREFUSED and one line on
 * stderr; a receive is returned unchanged (the route then shows as `encap bpf`).
 *
 * Interposed: socket, close, send, sendto, sendmsg, recv, recvfrom, recvmsg (what iproute2 6.1's
 * lib/libnetlink.c uses). Built with gcc -shared -fPIC by substrate/dataplane/ebpf/build.py.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/genetlink.h>
#include <linux/if_link.h>
#include <linux/lwtunnel.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 1024
#define NAME_MAGIC "anibench:"
#define DEFAULT_SOCKET "/run/anibench/dataplane.sock"
#define MAX_DGRAM (1 << 20)

struct pending {
	struct pending *next;
	size_t len;
	unsigned char data[];
};

struct nlfd {
	int proto;           /* NETLINK_ROUTE or NETLINK_GENERIC; -1: not tracked */
	uint32_t seg6_family; /* generic netlink family id the service handed out, 0: none yet */
	struct pending *head, *tail;
};

static struct nlfd fds[MAX_FD];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int inited;

static int (*real_socket)(int, int, int);
static int (*real_close)(int);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recv)(int, void *, size_t, int);

static void init(void)
{
	if (inited)
		return;
	real_socket = dlsym(RTLD_NEXT, "socket");
	real_close = dlsym(RTLD_NEXT, "close");
	real_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
	real_recvmsg = dlsym(RTLD_NEXT, "recvmsg");
	real_sendto = dlsym(RTLD_NEXT, "sendto");
	real_send = dlsym(RTLD_NEXT, "send");
	real_recvfrom = dlsym(RTLD_NEXT, "recvfrom");
	real_recv = dlsym(RTLD_NEXT, "recv");
	for (int i = 0; i < MAX_FD; i++)
		fds[i].proto = -1;
	inited = 1;
}

static struct nlfd *tracked(int fd)
{
	init();
	if (fd < 0 || fd >= MAX_FD || fds[fd].proto < 0)
		return NULL;
	return &fds[fd];
}

static void drop_pending(struct nlfd *f)
{
	struct pending *p = f->head;
	while (p) {
		struct pending *n = p->next;
		free(p);
		p = n;
	}
	f->head = f->tail = NULL;
}

static void push_pending(struct nlfd *f, const unsigned char *data, size_t len)
{
	struct pending *p = malloc(sizeof(*p) + len);
	if (!p)
		return;
	p->next = NULL;
	p->len = len;
	memcpy(p->data, data, len);
	if (f->tail)
		f->tail->next = p;
	else
		f->head = p;
	f->tail = p;
}

/* -- what is relevant ---------------------------------------------------------------------- */

static int rta_u16(const struct rtattr *a, uint16_t *out)
{
	if (RTA_PAYLOAD(a) < 2)
		return 0;
	memcpy(out, RTA_DATA(a), 2);
	return 1;
}

/* A route message (RTM_NEWROUTE/RTM_DELROUTE) whose RTA_ENCAP_TYPE is seg6 or seg6local. */
static int route_is_seg6(const struct nlmsghdr *h)
{
	if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct rtmsg)))
		return 0;
	int len = h->nlmsg_len - NLMSG_LENGTH(sizeof(struct rtmsg));
	for (const struct rtattr *a = RTM_RTA(NLMSG_DATA(h)); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
		uint16_t t;
		if (a->rta_type == RTA_ENCAP_TYPE && rta_u16(a, &t) &&
		    (t == LWTUNNEL_ENCAP_SEG6 || t == LWTUNNEL_ENCAP_SEG6_LOCAL))
			return 1;
	}
	return 0;
}

/* Whether a nested attribute block holds an LWT BPF program whose name starts with NAME_MAGIC. */
static int bpf_encap_is_ours(const struct rtattr *encap)
{
	int len = RTA_PAYLOAD(encap);
	for (const struct rtattr *p = RTA_DATA(encap); RTA_OK(p, len); p = RTA_NEXT(p, len)) {
		int plen = RTA_PAYLOAD(p);
		for (const struct rtattr *n = RTA_DATA(p); RTA_OK(n, plen); n = RTA_NEXT(n, plen))
			if (n->rta_type == LWT_BPF_PROG_NAME &&
			    RTA_PAYLOAD(n) >= sizeof(NAME_MAGIC) - 1 &&
			    memcmp(RTA_DATA(n), NAME_MAGIC, sizeof(NAME_MAGIC) - 1) == 0)
				return 1;
	}
	return 0;
}

static int route_is_ours(const struct nlmsghdr *h)
{
	if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct rtmsg)))
		return 0;
	int len = h->nlmsg_len - NLMSG_LENGTH(sizeof(struct rtmsg));
	const struct rtattr *encap = NULL;
	uint16_t type = 0;
	for (const struct rtattr *a = RTM_RTA(NLMSG_DATA(h)); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
		if (a->rta_type == RTA_ENCAP_TYPE)
			rta_u16(a, &type);
		else if (a->rta_type == RTA_ENCAP)
			encap = a;
		else if (a->rta_type == RTA_MULTIPATH)
			return 1; /* nexthops may hold ours: let the service look */
	}
	return type == LWTUNNEL_ENCAP_BPF && encap && bpf_encap_is_ours(encap);
}

static int genl_is_seg6(const struct nlfd *f, const struct nlmsghdr *h)
{
	if (f->seg6_family && h->nlmsg_type == f->seg6_family)
		return 1;
	if (h->nlmsg_type != GENL_ID_CTRL || h->nlmsg_len < NLMSG_LENGTH(GENL_HDRLEN))
		return 0;
	const struct genlmsghdr *g = NLMSG_DATA(h);
	if (g->cmd != CTRL_CMD_GETFAMILY)
		return 0;
	int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
	for (const struct nlattr *a = (const void *)((const char *)g + GENL_HDRLEN); len >= (int)sizeof(*a) && a->nla_len >= sizeof(*a) && a->nla_len <= len;
	     len -= NLA_ALIGN(a->nla_len), a = (const void *)((const char *)a + NLA_ALIGN(a->nla_len)))
		if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_NAME && a->nla_len - NLA_HDRLEN >= 5 &&
		    memcmp((const char *)a + NLA_HDRLEN, "SEG6", 5) == 0)
			return 1;
	return 0;
}

/* The data plane's own helper devices in this namespace (names starting "sr6gso" or "sr6d", as
 * service.py HIDDEN_PREFIXES), looked up once per process in /sys/class/net (the node's sysfs;
 * `ip -n` mounts the target namespace's). -1: not looked yet. */
static int helpers = -1;

static int have_helpers(void)
{
	/* once seen, helpers stay; none seen yet is looked at again after a second (a long-running
	 * `ip monitor` started before the node's first SRv6 route) */
	static time_t looked;
	time_t now = time(NULL);
	if (helpers > 0 || (helpers == 0 && now - looked < 1))
		return helpers;
	looked = now;
	helpers = 0;
	DIR *d = opendir("/sys/class/net");
	if (!d)
		return helpers;
	for (struct dirent *e; (e = readdir(d));)
		if (strncmp(e->d_name, "sr6gso", 6) == 0 || strncmp(e->d_name, "sr6d", 4) == 0)
			helpers = 1;
	closedir(d);
	return helpers;
}

static int names_helper(const struct nlmsghdr *h)
{
	if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifinfomsg)))
		return 0;
	int len = h->nlmsg_len - NLMSG_LENGTH(sizeof(struct ifinfomsg));
	for (const struct rtattr *a = IFLA_RTA(NLMSG_DATA(h)); RTA_OK(a, len); a = RTA_NEXT(a, len))
		if (a->rta_type == IFLA_IFNAME) {
			const char *n = RTA_DATA(a);
			size_t l = RTA_PAYLOAD(a);
			return (l >= 6 && strncmp(n, "sr6gso", 6) == 0) || (l >= 4 && strncmp(n, "sr6d", 4) == 0);
		}
	return 0;
}

static int about_devices(uint16_t t)
{
	return t == RTM_NEWLINK || t == RTM_DELLINK || t == RTM_SETLINK || t == RTM_NEWADDR || t == RTM_DELADDR ||
	       t == RTM_NEWNEIGH || t == RTM_DELNEIGH || t == RTM_NEWRULE || t == RTM_DELRULE || t == RTM_NEWROUTE ||
	       t == RTM_DELROUTE || t == RTM_NEWNETCONF;
}

/* Does datagram buf hold something the service must see? dir 'S' (sent) or 'R' (received). */
static int relevant(const struct nlfd *f, const unsigned char *buf, size_t n, char dir)
{
	int len = (int)n;
	for (const struct nlmsghdr *h = (const void *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
		if (f->proto == NETLINK_GENERIC) {
			if (dir == 'S' && genl_is_seg6(f, h))
				return 1;
			continue;
		}
		if (dir == 'S' && (h->nlmsg_type == RTM_NEWROUTE || h->nlmsg_type == RTM_DELROUTE) && route_is_seg6(h))
			return 1;
		if (dir == 'R' && (h->nlmsg_type == RTM_NEWROUTE || h->nlmsg_type == RTM_DELROUTE) && route_is_ours(h))
			return 1;
		/* a device created or renamed to a name of the data plane's own helpers: refused there */
		if (dir == 'S' && (h->nlmsg_type == RTM_NEWLINK || h->nlmsg_type == RTM_SETLINK) && names_helper(h))
			return 1;
		/* where the data plane has helper devices, changes and dumps of devices, addresses,
		 * routes, rules and neighbours go by the service, which keeps the helpers out of them */
		if (about_devices(h->nlmsg_type) && (dir == 'R' || h->nlmsg_type != RTM_NEWROUTE) && have_helpers())
			return 1;
	}
	return 0;
}

/* -- the service --------------------------------------------------------------------------- */

/* Ask the service; on success queue its answer datagrams on f (for 'S') or return the one
 * rewritten datagram in *out (for 'R'). Returns 0; 1 when the service answers "pass" (count
 * 0xFFFFFFFF: the request is not the data plane's, the caller sends it to the kernel itself, with
 * the node's own privileges); or -1 with errno set. */
static int ask(int fd, struct nlfd *f, char op, const unsigned char *buf, size_t n, unsigned char **out, size_t *outlen)
{
	const char *path = getenv("ANIBENCH_DP_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct sockaddr_nl local = {0};
	socklen_t sl = sizeof(local);
	uint32_t port = 0;
	if (getsockname(fd, (struct sockaddr *)&local, &sl) == 0)
		port = local.nl_pid;
	strncpy(sa.sun_path, path && *path ? path : DEFAULT_SOCKET, sizeof(sa.sun_path) - 1);
	int s = real_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		real_close(s);
		errno = e;
		return -1;
	}
	unsigned char head[8] = {(unsigned char)op, (unsigned char)f->proto, 0, 0};
	memcpy(head + 4, &port, 4);
	struct iovec iov[2] = {{head, 8}, {(void *)buf, n}};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
	if (real_sendmsg(s, &m, 0) < 0)
		goto fail;
	unsigned char *ans = malloc(MAX_DGRAM);
	if (!ans)
		goto fail;
	ssize_t r = real_recv(s, ans, MAX_DGRAM, 0);
	if (r < 4) {
		free(ans);
		if (r >= 0)
			errno = EPROTO;
		goto fail;
	}
	uint32_t count;
	memcpy(&count, ans, 4);
	if (count == 0xFFFFFFFFu) {
		free(ans);
		real_close(s);
		return 1;
	}
	size_t off = 4;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t l;
		if (off + 4 > (size_t)r)
			break;
		memcpy(&l, ans + off, 4);
		off += 4;
		if (off + l > (size_t)r)
			break;
		if (op == 'R' && out) {
			*out = malloc(l);
			if (*out) {
				memcpy(*out, ans + off, l);
				*outlen = l;
			}
		} else {
			/* learn the family id the service hands out for "SEG6" (CTRL_ATTR_FAMILY_ID) */
			const struct nlmsghdr *h = (const void *)(ans + off);
			if (f->proto == NETLINK_GENERIC && l >= NLMSG_LENGTH(GENL_HDRLEN) && h->nlmsg_type == GENL_ID_CTRL) {
				int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
				for (const struct nlattr *a = (const void *)((const char *)NLMSG_DATA(h) + GENL_HDRLEN);
				     len >= (int)sizeof(*a) && a->nla_len >= sizeof(*a) && a->nla_len <= len;
				     len -= NLA_ALIGN(a->nla_len), a = (const void *)((const char *)a + NLA_ALIGN(a->nla_len)))
					if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_ID && a->nla_len >= NLA_HDRLEN + 2)
						memcpy(&f->seg6_family, (const char *)a + NLA_HDRLEN, 2);
			}
			push_pending(f, ans + off, l);
		}
		off += l;
	}
	free(ans);
	real_close(s);
	return 0;
fail:;
	int e = errno;
	real_close(s);
	errno = e;
	return -1;
}

/* -- interposed calls ---------------------------------------------------------------------- */

int socket(int domain, int type, int protocol)
{
	init();
	int fd = real_socket(domain, type, protocol);
	if (fd >= 0 && fd < MAX_FD && domain == AF_NETLINK && (protocol == NETLINK_ROUTE || protocol == NETLINK_GENERIC)) {
		pthread_mutex_lock(&lock);
		drop_pending(&fds[fd]);
		fds[fd].proto = protocol;
		fds[fd].seg6_family = 0;
		pthread_mutex_unlock(&lock);
	}
	return fd;
}

int close(int fd)
{
	init();
	if (fd >= 0 && fd < MAX_FD && fds[fd].proto >= 0) {
		pthread_mutex_lock(&lock);
		drop_pending(&fds[fd]);
		fds[fd].proto = -1;
		pthread_mutex_unlock(&lock);
	}
	return real_close(fd);
}

static ssize_t send_common(int fd, const struct msghdr *msg, int flags)
{
	struct nlfd *f = tracked(fd);
	if (!f)
		return real_sendmsg(fd, msg, flags);
	size_t n = 0;
	for (size_t i = 0; i < msg->msg_iovlen; i++)
		n += msg->msg_iov[i].iov_len;
	unsigned char *buf = malloc(n ? n : 1);
	if (!buf)
		return real_sendmsg(fd, msg, flags);
	size_t off = 0;
	for (size_t i = 0; i < msg->msg_iovlen; i++) {
		memcpy(buf + off, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
		off += msg->msg_iov[i].iov_len;
	}
	ssize_t ret;
	if (relevant(f, buf, n, 'S')) {
		/* message by message (iproute2's flush sends many deletes in one datagram): the
		 * service's, and the others sent here as datagrams of their own */
		int len = (int)n;
		ret = (ssize_t)n;
		for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			size_t one = NLMSG_ALIGN(h->nlmsg_len) <= (size_t)len ? NLMSG_ALIGN(h->nlmsg_len) : h->nlmsg_len;
			int asked = relevant(f, (void *)h, one, 'S') ? ask(fd, f, 'S', (void *)h, one, NULL, NULL) : 1;
			if (asked == 1) {
				struct iovec iov = {h, one};
				struct msghdr m = {.msg_name = msg->msg_name, .msg_namelen = msg->msg_namelen, .msg_iov = &iov, .msg_iovlen = 1};
				if (real_sendmsg(fd, &m, flags) < 0) {
					ret = -1;
					break;
				}
			} else if (asked < 0) {
				int e = errno;
				const char *why = (e == ECONNREFUSED || e == ENOENT) ? "is not running (its supervisor restarts it)"
					: (e == EAGAIN || e == ETIMEDOUT) ? "did not answer in time"
					: "closed the connection before answering (it died; its supervisor restarts it; "
					  "whether this change was made is not known: read the routes back)";
				fprintf(stderr, "ip: the SRv6 data-plane service of this node %s [%s]; "
						"SRv6 routes and the tunnel source cannot be changed now\n", why, strerror(e));
				errno = ECONNREFUSED;
				ret = -1;
				break;
			}
		}
	} else {
		ret = real_sendmsg(fd, msg, flags);
	}
	free(buf);
	return ret;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	return send_common(fd, msg, flags);
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t tl)
{
	if (!tracked(fd))
		return real_sendto(fd, buf, len, flags, to, tl);
	struct iovec iov = {(void *)buf, len};
	struct msghdr m = {.msg_name = (void *)to, .msg_namelen = tl, .msg_iov = &iov, .msg_iovlen = 1};
	return send_common(fd, &m, flags);
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	return sendto(fd, buf, len, flags, NULL, 0);
}

/* Serve one datagram from the head of f's queue into msg, as recvmsg would. */
static ssize_t serve(struct nlfd *f, struct msghdr *msg, int flags)
{
	struct pending *p = f->head;
	size_t off = 0;
	for (size_t i = 0; i < msg->msg_iovlen && off < p->len; i++) {
		size_t c = p->len - off < msg->msg_iov[i].iov_len ? p->len - off : msg->msg_iov[i].iov_len;
		memcpy(msg->msg_iov[i].iov_base, p->data + off, c);
		off += c;
	}
	if (msg->msg_name && msg->msg_namelen >= sizeof(struct sockaddr_nl)) {
		struct sockaddr_nl k = {.nl_family = AF_NETLINK};
		memcpy(msg->msg_name, &k, sizeof(k));
		msg->msg_namelen = sizeof(k);
	}
	msg->msg_controllen = 0;
	msg->msg_flags = off < p->len ? MSG_TRUNC : 0;
	ssize_t ret = (flags & MSG_TRUNC) ? (ssize_t)p->len : (ssize_t)off;
	if (!(flags & MSG_PEEK)) {
		f->head = p->next;
		if (!f->head)
			f->tail = NULL;
		free(p);
	}
	return ret;
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct nlfd *f = tracked(fd);
	if (!f)
		return real_recvmsg(fd, msg, flags);
	if (f->head)
		return serve(f, msg, flags);
	/* read the kernel's next datagram whole, so it can be looked at and rewritten; one the
	 * service empties (it held only the data plane's own helpers) is skipped */
again:;
	unsigned char probe[16];
	struct iovec piov = {probe, sizeof(probe)};
	struct sockaddr_nl from;
	struct msghdr pm = {.msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &piov, .msg_iovlen = 1};
	ssize_t size = real_recvmsg(fd, &pm, MSG_PEEK | MSG_TRUNC | (flags & MSG_DONTWAIT));
	if (size < 0)
		return size;
	unsigned char *buf = malloc(size ? size : 1);
	if (!buf)
		return real_recvmsg(fd, msg, flags);
	struct iovec iov = {buf, size};
	struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n = real_recvmsg(fd, &m, flags & MSG_DONTWAIT);
	if (n < 0) {
		free(buf);
		return n;
	}
	unsigned char *rew = NULL;
	size_t rewlen = 0;
	if (from.nl_pid == 0 && relevant(f, buf, n, 'R') && ask(fd, f, 'R', buf, n, &rew, &rewlen) == 0 && rew) {
		if (rewlen == 0 && n > 0) {
			free(rew);
			free(buf);
			goto again;
		}
		push_pending(f, rew, rewlen);
		free(rew);
	} else {
		push_pending(f, buf, n);
	}
	free(buf);
	ssize_t ret = serve(f, msg, flags);
	if (msg->msg_name && from.nl_pid != 0)
		memcpy(msg->msg_name, &from, sizeof(from));
	return ret;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *src, socklen_t *sl)
{
	if (!tracked(fd))
		return real_recvfrom(fd, buf, len, flags, src, sl);
	struct iovec iov = {buf, len};
	struct msghdr m = {.msg_name = src, .msg_namelen = sl ? *sl : 0, .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = recvmsg(fd, &m, flags);
	if (r >= 0 && sl)
		*sl = m.msg_namelen;
	return r;
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	return recvfrom(fd, buf, len, flags, NULL, NULL);
}
