// SPDX-License-Identifier: Apache-2.0
/*
 * end.c -- SRv6 End (RFC 8986 4.1), optionally with the NEXT-C-SID flavor (RFC 9800 4.1),
 * as an LWT BPF program on the xmit hook of the SID route (`encap bpf xmit pinned ..`).
 *
 * LWT_IN programs cannot write the packet, so the SID route is an ordinary forwarding route:
 * ip6_forward checks and decrements the hop limit once (the kernel's End decrements it in the
 * ip6_forward that follows the action), then this program rewrites the destination with
 * bpf_skb_store_bytes and returns BPF_LWT_REROUTE, so the kernel routes the packet again on
 * the new destination. Behaviour, as net/ipv6/seg6_local.c input_action_end /
 * end_next_csid_core:
 *   - NEXT-C-SID (CFG.flavor = 1): if the argument (bytes lblen+nflen .. 15 of the DA) is not
 *     all zero, shift it left by nflen bytes into the Node+Function position and zero the
 *     last nflen bytes (seg6_next_csid_advance_arg); else fall through to End.
 *   - End: find the SRH (the routing header of type 4, after at most 3 Hop-by-Hop/Destination
 *     options headers); none, or Segments Left = 0, or inconsistent (type, Last Entry,
 *     Segments Left > Last Entry + 1, as seg6_validate_srh with reduced SRHs allowed): drop.
 *     Else Segments Left -= 1, DA = Segment List[Segments Left].
 *   - not IPv6: drop.
 * Counters (the kernel's `count`): packets/bytes (skb->len at entry) of rewritten packets,
 * errors = dropped ones. The kernel also counts as errors the packets ip6_forward drops AFTER
 * the action (hop limit exceeded); here ip6_forward runs BEFORE, so those are not counted.
 * Not done: HMAC TLV validation (CONFIG_IPV6_SEG6_HMAC), TLV consistency checks.
 */
#include "srv6.h"

struct end_cfg {
	__u8 flavor;  /* 0: End, 1: NEXT-C-SID */
	__u8 lblen;   /* locator-block length, bytes (lblen bits / 8) */
	__u8 nflen;   /* node+function length, bytes */
	__u8 pad;
};

const volatile struct end_cfg CFG = {};

SRV6_COUNTERS();

#define DA_OFF 24
#define MAX_TLVS 16

static __always_inline int end_srh(struct __sk_buff *skb)
{
	__u8 nh, ext[8];
	__u32 off = 40;
	__u8 hdr6[8];
	int i;

	if (bpf_skb_load_bytes(skb, 0, hdr6, sizeof(hdr6)) < 0)
		return -1;
	nh = hdr6[6];
	for (i = 0; i < 4; i++) {
		if (nh == NEXTHDR_ROUTING)
			break;
		if (nh != 0 && nh != 60)  /* Hop-by-Hop, Destination Options */
			return -1;
		if (bpf_skb_load_bytes(skb, off, ext, 2) < 0)
			return -1;
		nh = ext[0];
		off += ((__u32)ext[1] + 1) * 8;
	}
	if (nh != NEXTHDR_ROUTING)
		return -1;
	if (bpf_skb_load_bytes(skb, off, ext, 8) < 0)
		return -1;
	/* ext: nexthdr, hdrlen, type, segments_left, last_entry, flags, tag */
	{
		__u8 hdrlen = ext[1], sl = ext[3], le = ext[4];
		struct in6_addr seg;

		if (ext[2] != SRV6_SRH_TYPE || sl == 0)
			return -1;
		if (le > hdrlen / 2 - 1 || sl > le + 1 || hdrlen / 2 == 0)
			return -1;
		/* the whole SRH is in the packet, and its TLVs fill it exactly, as seg6_get_srh and
		 * seg6_validate_srh (net/ipv6/seg6.c) require: each TLV is type, length, value (at most
		 * MAX_TLVS of them here; an SRH with more is dropped) */
		{
			__u32 end = off + ((__u32)hdrlen + 1) * 8;
			__u32 t = off + 8 + ((__u32)le + 1) * 16;
			__u8 last, tl[2];

			if (bpf_skb_load_bytes(skb, end - 1, &last, 1) < 0)
				return -1;
			for (i = 0; i < MAX_TLVS && t < end; i++) {
				if (t + 2 > end || bpf_skb_load_bytes(skb, t, tl, 2) < 0)
					return -1;
				t += 2 + (__u32)tl[1];
			}
			if (t != end)
				return -1;
		}
		sl -= 1;
		if (bpf_skb_load_bytes(skb, off + 8 + (__u32)sl * 16, &seg, 16) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, off + 3, &sl, 1, 0) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, DA_OFF, &seg, 16, 0) < 0)
			return -1;
	}
	return 0;
}

SEC("lwt_xmit")
int end_xmit(struct __sk_buff *skb)
{
	__u32 len = skb->len;

	if (skb->protocol != bpf_htons(SRV6_ETH_P_IPV6))
		goto drop;

	if (CFG.flavor == 1) {
		__u8 da[16], nd[16];
		__u32 b = CFG.lblen, f = CFG.nflen;
		__u8 any = 0;
		int i;

		if (bpf_skb_load_bytes(skb, DA_OFF, da, 16) < 0)
			goto drop;
#pragma unroll
		for (i = 0; i < 16; i++)
			if (i >= b + f)
				any |= da[i];
		if (any) {
#pragma unroll
			for (i = 0; i < 16; i++) {
				if (i < b)
					nd[i] = da[i];
				else if (i < 16 - f) {
					__u32 j = i + f;
					nd[i] = da[j & 15];
				} else
					nd[i] = 0;
			}
			if (bpf_skb_store_bytes(skb, DA_OFF, nd, 16, 0) < 0)
				goto drop;
			SRV6_COUNT(1, len);
			return BPF_LWT_REROUTE;
		}
	}
	if (end_srh(skb) < 0)
		goto drop;
	SRV6_COUNT(1, len);
	return BPF_LWT_REROUTE;
drop:
	SRV6_COUNT(0, 0);
	return BPF_DROP;
}

char LICENSE[] SEC("license") = "Apache-2.0";
