// SPDX-License-Identifier: GPL-2.0
/*
 * SRv6 decapsulating endpoint behaviours in eBPF (RFC 8986 4.4-4.8):
 * End.DX6, End.DX4, End.DT6, End.DT4, End.DT46.
 *
 * Two programs cooperate, because no single BPF program type can both be
 * selected by a kernel route and remove bytes at the front of a packet:
 *
 *   srv6_decap_sid  (lwt_xmit) -- one instance per SID route
 *       (`ip -6 route add SID encap bpf xmit pinned PIN dev DEV`). Its
 *       .rodata holds the behaviour and the helper device's ifindex.
 *       It validates the packet as the kernel's decap_and_validate() does
 *       (SRH with Segments Left != 0 -> drop; inner header of the wrong
 *       family -> drop), counts packets/bytes/errors in its own "counters"
 *       map (srv6.h), and redirects the still-encapsulated packet
 *       into the INGRESS of the SID's helper device (an L3 `tun` device, so
 *       the redirect needs no MAC header).
 *
 *   srv6_decap_strip (tc, clsact ingress of every helper device) -- strips
 *       the outer IPv6 header and its extension headers, sets skb->protocol
 *       for the inner packet and lets it continue into ip_rcv()/ipv6_rcv().
 *       The kernel then runs PREROUTING, the routing decision (policy rule
 *       `iif HELPER lookup TABLE`), ip_forward()/ip6_forward() (TTL/hop
 *       limit decrement, FORWARD, POSTROUTING) exactly as for any packet.
 *
 * Nothing travels from the first program to the second: the LWT hook runs
 * its program through bpf_prog_run_save_cb() (net/core/lwt_bpf.c), which
 * restores skb->cb[] afterwards, and __dev_forward_skb zeroes skb->priority;
 * skb->mark is the firewall's. The helper device itself (one per DT table,
 * one per DX next hop) tells the kernel which table to use, and the strip
 * program re-parses the (already validated) extension-header chain.
 *
 * Counters (`count`): the per-instance "counters" map of srv6.h, read by
 * loader.read_counters(prog_id): packets/bytes (outer L3 length) of packets
 * handed to the helper device, errors = packets dropped by the validation.
 */
#include "srv6.h"
#include <linux/pkt_cls.h>
#include <linux/errno.h>

#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

/* Behaviour codes (also used by decap.py). */
#define DECAP_DT6 1
#define DECAP_DT4 2
#define DECAP_DT46 3
#define DECAP_DX4 4
#define DECAP_DX6 5

#define MAX_EXT_HDRS 8

#define NH_HOP 0
#define NH_IPIP 4
#define NH_IPV6 41
#define NH_ROUTING 43
#define NH_FRAGMENT 44
#define NH_AH 51
#define NH_DSTOPTS 60
#define SRH_TYPE 4

/* Set by the host-side loader before load (libbpf .rodata). */
const volatile __u32 cfg_behaviour = 0;
const volatile __u32 cfg_ifindex = 0;
/* End.DX4/DX6 only, read by the strip program: the next hop (nh4/nh6) and its
 * family (4 or 6; 0 = not a DX helper). cfg_nh holds 4 bytes of nh4 or the 16
 * of nh6, in network order. */
const volatile __u32 cfg_nh_family = 0;
const volatile __u32 cfg_nh[4] = {0, 0, 0, 0};

SRV6_COUNTERS();

/* Diagnostics of the strip program: [0] packets stripped, [1] dropped (no
 * valid inner header, or bpf_skb_adjust_room refused), [2] dropped because the
 * DX next hop has no route (dx_unroutable). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);

	if (v)
		*v += 1;
}

/*
 * Walk the outer IPv6 header's extension-header chain (the skb data starts
 * at the IPv6 header in both program types). Returns the offset of the
 * upper-layer header and stores its protocol in *proto, or -1 when the
 * packet must be dropped: an SRH with Segments Left != 0 (RFC 8986 4.4-4.8,
 * kernel decap_and_validate), a truncated header, a fragment, too many
 * extension headers, or an upper layer that is neither IPv4 nor IPv6.
 * Not checked (the kernel does): the SRH's own consistency
 * (seg6_validate_srh: the kernel then treats the SRH as absent) and HMAC.
 */
static __always_inline int find_inner(struct __sk_buff *skb, __u8 *proto)
{
	struct ipv6hdr ip6;
	__u8 buf[4];
	__u32 off = sizeof(struct ipv6hdr);
	__u8 nh;
	int i;

	if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
		return -1;
	if (ip6.version != 6)
		return -1;
	nh = ip6.nexthdr;

#pragma unroll
	for (i = 0; i < MAX_EXT_HDRS; i++) {
		if (nh != NH_HOP && nh != NH_ROUTING && nh != NH_DSTOPTS &&
		    nh != NH_AH)
			break;
		if (bpf_skb_load_bytes(skb, off, buf, sizeof(buf)) < 0)
			return -1;
		/* an SRH (routing type 4) with Segments Left != 0; the kernel
		 * skips other routing types (seg6_get_srh returns NULL) */
		if (nh == NH_ROUTING && buf[2] == SRH_TYPE && buf[3] != 0)
			return -1;
		if (nh == NH_AH)
			off += ((__u32)buf[1] + 2) * 4;
		else
			off += ((__u32)buf[1] + 1) * 8;
		nh = buf[0];
	}
	if (nh != NH_IPV6 && nh != NH_IPIP)
		return -1;
	*proto = nh;
	return off;
}

SEC("lwt_xmit")
int srv6_decap_sid(struct __sk_buff *skb)
{
	__u32 len = skb->len;
	__u8 proto = 0;
	int off;

	if (skb->protocol != bpf_htons(SRV6_ETH_P_IPV6))
		goto drop;
	off = find_inner(skb, &proto);
	if (off < 0)
		goto drop;

	switch (cfg_behaviour) {
	case DECAP_DT6:
	case DECAP_DX6:
		if (proto != NH_IPV6)
			goto drop;
		break;
	case DECAP_DT4:
	case DECAP_DX4:
		if (proto != NH_IPIP)
			goto drop;
		break;
	case DECAP_DT46:
		break;
	default:
		goto drop;
	}
	/* the kernel's pskb_may_pull(inner header) */
	if (skb->len < off + (proto == NH_IPV6 ? sizeof(struct ipv6hdr)
					       : sizeof(struct iphdr)))
		goto drop;

	SRV6_COUNT(1, len);
	return bpf_redirect(cfg_ifindex, BPF_F_INGRESS);

drop:
	SRV6_COUNT(0, len);
	return BPF_DROP;
}

/*
 * End.DX4/DX6: does the main table route the next hop now? The kernel looks
 * nh4/nh6 up for every packet (input_action_end_dx4: ip_route_input;
 * input_action_end_dx6: seg6_lookup_nexthop), so a packet whose next hop has
 * no route is dropped at once. The helper's private table, which carries the
 * packet on through the kernel's forwarding path (so netfilter sees it), is
 * re-pointed by the host-side service when the route changes; this check makes
 * "no route any more" exact per packet in between. bpf_fib_lookup with
 * BPF_FIB_LOOKUP_DIRECT reads the main table only (as decap.py's resolution);
 * SKIP_NEIGH: an unresolved neighbour is the kernel path's to resolve.
 * Returns 1 when the packet must be dropped.
 */
static __always_inline int dx_unroutable(struct __sk_buff *skb)
{
	struct bpf_fib_lookup fib = {};
	long rc;

	if (cfg_nh_family == 4) {
		fib.family = 2; /* AF_INET */
		fib.ipv4_dst = cfg_nh[0];
	} else if (cfg_nh_family == 6) {
		fib.family = 10; /* AF_INET6 */
		fib.ipv6_dst[0] = cfg_nh[0];
		fib.ipv6_dst[1] = cfg_nh[1];
		fib.ipv6_dst[2] = cfg_nh[2];
		fib.ipv6_dst[3] = cfg_nh[3];
	} else {
		return 0;
	}
	fib.ifindex = skb->ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib),
			    BPF_FIB_LOOKUP_DIRECT | BPF_FIB_LOOKUP_SKIP_NEIGH);
	return rc == BPF_FIB_LKUP_RET_BLACKHOLE ||
	       rc == BPF_FIB_LKUP_RET_UNREACHABLE ||
	       rc == BPF_FIB_LKUP_RET_PROHIBIT ||
	       rc == BPF_FIB_LKUP_RET_NOT_FWDED;
}

SEC("tc")
int srv6_decap_strip(struct __sk_buff *skb)
{
	__u8 proto = 0;
	int off;
	long err;
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;

	if (skb->protocol != bpf_htons(SRV6_ETH_P_IPV6))
		return TC_ACT_SHOT;
	off = find_inner(skb, &proto);
	if (off < 0) {
		stat_inc(1);
		return TC_ACT_SHOT;
	}

	flags |= proto == NH_IPV6 ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6
				  : BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
	err = bpf_skb_adjust_room(skb, -off, BPF_ADJ_ROOM_MAC, flags);
	if (err == -EINVAL) {
		/* Kernels before 6.3 lack the DECAP_L3 flags (untested here):
		 * IPv6 inner needs no protocol change; IPv4 inner changes the
		 * protocol first (which pops 20 bytes), then pops the rest. */
		if (proto == NH_IPV6)
			err = bpf_skb_adjust_room(skb, -off, BPF_ADJ_ROOM_MAC,
						  BPF_F_ADJ_ROOM_FIXED_GSO);
		else if (!(err = bpf_skb_change_proto(skb, bpf_htons(SRV6_ETH_P_IP), 0)))
			err = bpf_skb_adjust_room(skb, -(off - 20), BPF_ADJ_ROOM_MAC,
						  BPF_F_ADJ_ROOM_FIXED_GSO);
	}
	if (err) {
		stat_inc(1);
		return TC_ACT_SHOT;
	}
	if (dx_unroutable(skb)) {
		stat_inc(2);
		return TC_ACT_SHOT;
	}
	stat_inc(0);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
