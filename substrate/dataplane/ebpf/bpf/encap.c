// SPDX-License-Identifier: Apache-2.0
/*
 * encap.c -- SRv6 H.Encaps and H.Encaps.Red (RFC 8986 5.1/5.2) as LWT BPF programs.
 *
 * One instance per route (`encap bpf in pinned .. xmit pinned ..`), configured through CFG
 * (.rodata, written by the loader before load; layout = struct encap_cfg below, packed by
 * substrate/dataplane/ebpf/loader.py encap_rodata):
 *   - encap_in (SEC lwt_in): forwarded packets, encapsulated at route input like the kernel's
 *     seg6_input (net/ipv6/seg6_iptunnel.c): after BPF_LWT_REROUTE the kernel routes the OUTER
 *     packet and ip6_forward decrements the outer hop limit; the inner one stays as received.
 *   - encap_xmit (SEC lwt_xmit): locally originated packets, like seg6_output.
 *
 * The outer header is the kernel's (__seg6_do_srh_encap / seg6_do_srh_encap_red, with
 * net.ipv6.seg6_flowlabel = 0):
 *   IPv6 payload: version 6, traffic class and flow label copied from the inner header
 *                 (the inner's first 32-bit word with version 6), hop limit = inner hop limit;
 *   IPv4 payload: traffic class 0, flow label 0, hop limit = CFG.hop_limit_v4 (the loader's
 *                 value of ip6_dst_hoplimit() for the route: its hoplimit metric, else the
 *                 device's net.ipv6.conf.DEV.hop_limit);
 *   payload length = inner length + SRH length; next header = 43 with an SRH, else 41 (IPv6)
 *   or 4 (IPv4); the SRH is prebuilt by the loader (segments in reverse order, SL = LE = n-1;
 *   encap.red drops the first SID from the SRH, and the whole SRH when n = 1);
 *   source = the node's tunsrc map key 0 (`ip sr tunsrc`) when set, else CFG.src when set
 *   (an address the host picked for the route, e.g. `ip route get S1`'s src), else the node's
 *   default source (tunsrc map key 1, set by the host). The kernel picks it per packet with
 *   ipv6_dev_get_saddr(route dev, S1); LWT programs have no helper for that (no
 *   bpf_fib_lookup in LWT programs, net/core/filter.c lwt_out_func_proto).
 *
 * Drops (counted as errors): a packet whose family is not CFG.family, a failed push.
 *
 * GSO (e.g. TCP bulk through a router: veth hands GSO skbs between namespaces):
 * bpf_lwt_push_encap only fixes the GSO metadata of GRE/UDP/plain IP-in-IP encapsulations
 * (net/core/lwt_bpf.c handle_gso_encap): with an SRH (next header 43) or an IPv4 payload it
 * returns -EPROTONOSUPPORT and the packet is lost. When the node has a GSO helper device
 * (tunsrc map key 2, see encap_gso.c), GSO skbs take another path, which gives the same bytes
 * on the wire as the kernel's seg6 (skb_shinfo gso_type |= SKB_GSO_IPXIP6 so the kernel's
 * own IPv6 GSO segments the SRv6 packet when it must; gso_size kept, as seg6 keeps it):
 *   - encap_in lets the GSO skb go on un-encapsulated (BPF_OK): ip6_forward/ip_forward
 *     forwards the inner packet on this route, so it reaches encap_xmit;
 *   - encap_xmit restores the inner hop limit / TTL the forward decremented (forwarded skbs,
 *     skb->ingress_ifindex != 0), prepends a dummy Ethernet header + the outer header
 *     (bpf_skb_change_head) and redirects the skb into the helper device's ingress; the
 *     outer hop limit of a locally originated packet is set one higher, as the helper's
 *     ip6_forward will decrement it (seg6_output does not);
 *   - encap_gso.c (tc ingress on the helper) re-inserts the outer header with
 *     bpf_skb_adjust_room(BPF_F_ADJ_ROOM_ENCAP_L3_IPV6), and the kernel routes and forwards
 *     the outer packet (hop limit decremented once, as after seg6_input).
 * Without a helper, a GSO skb is pushed as any other (fine without SRH for IPv6 payloads,
 * where the kernel decreases gso_size by the header length; dropped otherwise).
 */
#include "srv6.h"

#define ENCAP_HDR_MAX SRV6_MAX_ENCAP

struct encap_cfg {
	__u8 hdr[ENCAP_HDR_MAX] __attribute__((aligned(8)));  /* outer IPv6 header (DA set) + SRH, network order */
	__u16 len;                 /* bytes of hdr to push: 40 + SRH length */
	__u8 proto_off;            /* offset in hdr of the byte that gets 41/4 (6 or 40) */
	__u8 hop_limit_v4;         /* outer hop limit for IPv4 payloads */
	__u8 family;               /* payload family: 4 or 6 (the route's) */
	__u8 pad[3];
	struct in6_addr src;       /* source when the node's tunsrc is unset */
};

const volatile struct encap_cfg CFG = {};

SRV6_COUNTERS();
SRV6_TUNSRC_MAP();

static __always_inline int addr_set(const struct in6_addr *a)
{
	return (a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] | a->in6_u.u6_addr32[2] |
		a->in6_u.u6_addr32[3]) != 0;
}

static __always_inline int node_gso_ifindex(void)
{
	__u32 key = SRV6_NODE_GSO_IFINDEX;
	struct srv6_tunsrc *v = bpf_map_lookup_elem(&tunsrc, &key);

	return v ? (int)v->addr.in6_u.u6_addr32[0] : 0;
}

/* Fill hdr[0..CFG.len) with the outer header for this packet; 0 or -1 (drop). */
static __always_inline int build_hdr(struct __sk_buff *skb, __u8 *hdr)
{
	__u32 len = CFG.len;
	__u32 key;
	struct srv6_tunsrc *ts;
	int i;
	const struct encap_cfg *cfg = (const struct encap_cfg *)&CFG;

	/* an opaque pointer: the compiler must load (8 bytes at a time) instead of assuming
	 * the zero initializer, and the verifier walks 32 loads instead of a 256-step loop */
	asm volatile("" : "+r"(cfg));
	if (len < 40 || len > ENCAP_HDR_MAX)
		return -1;
#pragma unroll
	for (i = 0; i < ENCAP_HDR_MAX / 8; i++)
		((__u64 *)hdr)[i] = ((const __u64 *)cfg->hdr)[i];

	if (CFG.family == 6) {
		__u8 in6[8];

		if (skb->protocol != bpf_htons(SRV6_ETH_P_IPV6))
			return -1;
		if (bpf_skb_load_bytes(skb, 0, in6, sizeof(in6)) < 0)
			return -1;
		/* version 6, inner traffic class and flow label, inner hop limit */
		hdr[0] = 0x60 | (in6[0] & 0x0f);
		hdr[1] = in6[1];
		hdr[2] = in6[2];
		hdr[3] = in6[3];
		hdr[7] = in6[7];
		hdr[CFG.proto_off & 0xff] = SRV6_IPPROTO_IPV6;
	} else {
		if (skb->protocol != bpf_htons(SRV6_ETH_P_IP))
			return -1;
		hdr[0] = 0x60;
		hdr[1] = 0;
		hdr[2] = 0;
		hdr[3] = 0;
		hdr[7] = CFG.hop_limit_v4;
		hdr[CFG.proto_off & 0xff] = SRV6_IPPROTO_IPIP;
	}
	/* payload length (a GSO skb's total; the kernel's GSO rewrites it per segment) */
	{
		__u32 pl = skb->len + len - 40;

		hdr[4] = (pl >> 8) & 0xff;
		hdr[5] = pl & 0xff;
	}
	/* source: `ip sr tunsrc`, else the route's, else the node's default */
	key = SRV6_TUNSRC_SET;
	ts = bpf_map_lookup_elem(&tunsrc, &key);
	if (ts && addr_set(&ts->addr)) {
		__builtin_memcpy(&hdr[8], &ts->addr, 16);
	} else if (addr_set(&cfg->src)) {
		__builtin_memcpy(&hdr[8], &cfg->src, 16);
	} else {
		key = SRV6_TUNSRC_DEFAULT;
		ts = bpf_map_lookup_elem(&tunsrc, &key);
		if (ts)
			__builtin_memcpy(&hdr[8], &ts->addr, 16);
	}
	return 0;
}

/* A forwarded packet reaches the xmit hook after ip_forward/ip6_forward took one off its TTL /
 * hop limit; the kernel's seg6_input encapsulates before that forward and leaves the inner one as
 * received: put it back (fixing the IPv4 header checksum). 0, or -1 (drop). */
static __always_inline int restore_inner_hop_limit(struct __sk_buff *skb)
{
	if (CFG.family == 6) {
		__u8 hl;

		if (bpf_skb_load_bytes(skb, 7, &hl, 1) < 0 || hl == 255)
			return -1;
		hl += 1;
		if (bpf_skb_store_bytes(skb, 7, &hl, 1, 0) < 0)
			return -1;
	} else {
		__u8 tp[2];
		__u16 old, new;

		if (bpf_skb_load_bytes(skb, 8, tp, 2) < 0 || tp[0] == 255)
			return -1;
		old = bpf_htons(((__u16)tp[0] << 8) | tp[1]);
		tp[0] += 1;
		new = bpf_htons(((__u16)tp[0] << 8) | tp[1]);
		if (bpf_l3_csum_replace(skb, 10, old, new, 2) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, 8, tp, 1, 0) < 0)
			return -1;
	}
	return 0;
}

/* Encapsulate on the input hook (at_xmit 0: before the inner forward, as seg6_input) or on the
 * xmit hook (at_xmit 1: a forwarded packet comes after its inner forward, whose hop-limit
 * decrement is undone and put on the outer instead; a local one as seg6_output). */
static __always_inline int do_encap(struct __sk_buff *skb, __u8 *hdr, int at_xmit)
{
	__u32 pkt_len = skb->len;
	int forwarded = at_xmit && skb->ingress_ifindex != 0;

	if (forwarded && restore_inner_hop_limit(skb) < 0)
		goto drop;
	if (build_hdr(skb, hdr) < 0)
		goto drop;
	if (forwarded && hdr[7] > 0)
		hdr[7] -= 1;  /* the outer leaves as the kernel's ip6_forward of the outer would leave it */
	if (bpf_lwt_push_encap(skb, BPF_LWT_ENCAP_IP, hdr, CFG.len) != 0)
		goto drop;
	SRV6_COUNT(1, pkt_len);
	return BPF_LWT_REROUTE;
drop:
	SRV6_COUNT(0, 0);
	return BPF_DROP;
}

/* GSO skb on the xmit hook: see the file comment. */
static __always_inline int do_encap_gso(struct __sk_buff *skb, __u8 *hdr, int ifindex)
{
	__u8 eth[14] = {};
	__u32 pkt_len = skb->len;
	__u32 len = CFG.len;

	if (len < 40 || len > ENCAP_HDR_MAX)
		goto drop;
	if (skb->ingress_ifindex && restore_inner_hop_limit(skb) < 0)
		goto drop;
	if (build_hdr(skb, hdr) < 0)
		goto drop;
	if (!skb->ingress_ifindex && hdr[7] < 255)
		hdr[7] += 1;  /* the helper's ip6_forward takes it back */
	if (bpf_skb_change_head(skb, 14 + len, 0) < 0)
		goto drop;
	eth[12] = 0x86;
	eth[13] = 0xdd;
	if (bpf_skb_store_bytes(skb, 0, eth, sizeof(eth), 0) < 0)
		goto drop;
	if (bpf_skb_store_bytes(skb, 14, hdr, len, 0) < 0)
		goto drop;
	SRV6_COUNT(1, pkt_len);
	return bpf_redirect(ifindex, BPF_F_INGRESS);
drop:
	SRV6_COUNT(0, 0);
	return BPF_DROP;
}

SEC("lwt_in")
int encap_in(struct __sk_buff *skb)
{
	__u64 hdr[ENCAP_HDR_MAX / 8];

	if (skb->gso_size && node_gso_ifindex())
		return BPF_OK;  /* encapsulated by encap_xmit after the inner forward */
	return do_encap(skb, (__u8 *)hdr, 0);
}

SEC("lwt_xmit")
int encap_xmit(struct __sk_buff *skb)
{
	__u64 hdr[ENCAP_HDR_MAX / 8];

	if (skb->gso_size) {
		int ifindex = node_gso_ifindex();

		if (ifindex)
			return do_encap_gso(skb, (__u8 *)hdr, ifindex);
	}
	return do_encap(skb, (__u8 *)hdr, 1);
}

char LICENSE[] SEC("license") = "Apache-2.0";
