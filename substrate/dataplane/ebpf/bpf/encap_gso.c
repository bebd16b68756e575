// SPDX-License-Identifier: Apache-2.0
/*
 * encap_gso.c -- second half of H.Encaps(.Red) for GSO skbs (first half: encap.c
 * do_encap_gso). One instance per node, on the tc (clsact) INGRESS of the node's GSO helper
 * device (an Ethernet-type device, a portless bridge; loader.gso_helper_up). No parameters.
 *
 * encap_xmit redirected the skb here as [dummy Ethernet][outer IPv6 (+SRH)][inner packet],
 * the outer header complete but unknown to the skb's metadata (not `encapsulation`, gso_type
 * without SKB_GSO_IPXIP6). This program reads the outer header, removes it and inserts it
 * again with bpf_skb_adjust_room(+len, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 |
 * BPF_F_ADJ_ROOM_FIXED_GSO), which sets the inner header offsets, skb->encapsulation and
 * gso_type |= SKB_GSO_IPXIP6 (net/core/filter.c bpf_skb_net_grow) -- what
 * seg6_do_srh + iptunnel_handle_offloads(skb, SKB_GSO_IPXIP6) leave on a kernel-encapsulated
 * skb, gso_size unchanged -- then writes the header back and lets the packet enter the IPv6
 * stack of the helper (pkt_type forced to PACKET_HOST): ip6_rcv, routing on the outer
 * destination, ip6_forward. The kernel's IPv6 GSO (ipv6_gso_segment: routing header is an
 * INET6_PROTO_GSO_EXTHDR, then ip6ip6/ip4ip6 offload) segments it wherever it must.
 *
 * Drops (stats map, index 1): not IPv6, header longer than SRV6_MAX_ENCAP, adjust failures.
 * Passes (index 0): re-encapsulated skbs.
 */
#include "srv6.h"
#include <linux/pkt_cls.h>

#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} gso_stats SEC(".maps");

static __always_inline void stat(__u32 k)
{
	__u64 *v = bpf_map_lookup_elem(&gso_stats, &k);

	if (v)
		*v += 1;
}

SEC("tc")
int encap_gso_ingress(struct __sk_buff *skb)
{
	__u8 hdr[SRV6_MAX_ENCAP];
	__u8 b[8];
	__u32 len = 40, inner;
	__u64 shrink;

	if (skb->protocol != bpf_htons(SRV6_ETH_P_IPV6))
		goto drop;
	if (bpf_skb_load_bytes(skb, 14, b, 8) < 0)
		goto drop;
	inner = b[6];
	if (inner == NEXTHDR_ROUTING) {
		if (bpf_skb_load_bytes(skb, 14 + 40, b, 2) < 0)
			goto drop;
		inner = b[0];
		len += ((__u32)b[1] + 1) * 8;
	}
	if (inner != SRV6_IPPROTO_IPV6 && inner != SRV6_IPPROTO_IPIP)
		goto drop;
	if (len > SRV6_MAX_ENCAP)
		goto drop;
	asm volatile("" : "+r"(len));  /* keep the bound on the register the helper gets */
	if (len > SRV6_MAX_ENCAP || len < 40)
		goto drop;
	if (bpf_skb_load_bytes(skb, 14, hdr, len) < 0)
		goto drop;
	shrink = BPF_F_ADJ_ROOM_FIXED_GSO |
		 (inner == SRV6_IPPROTO_IPIP ? BPF_F_ADJ_ROOM_DECAP_L3_IPV4 : BPF_F_ADJ_ROOM_DECAP_L3_IPV6);
	if (bpf_skb_adjust_room(skb, -(__s32)len, BPF_ADJ_ROOM_MAC, shrink) < 0)
		goto drop;
	if (bpf_skb_adjust_room(skb, len, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_FIXED_GSO) < 0)
		goto drop;
	if (bpf_skb_store_bytes(skb, 14, hdr, len, BPF_F_RECOMPUTE_CSUM) < 0)
		goto drop;
	bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
	stat(0);
	return TC_ACT_OK;
drop:
	stat(1);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Apache-2.0";
