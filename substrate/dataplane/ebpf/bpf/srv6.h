/* SPDX-License-Identifier: Apache-2.0 */
/*
 * srv6.h -- definitions shared by anibench's eBPF SRv6 programs (encap.c, end.c, decap.c).
 *
 * Every program object is loaded ONCE PER ROUTE by substrate/dataplane/ebpf/loader.py: its
 * parameters are a `const volatile` global (the object's .rodata, set by the loader before
 * load), so no per-route map lookup happens and nothing outlives the route.
 *
 * What this header gives:
 *   - SRV6_COUNTERS(): a per-CPU array map named "counters" (1 entry of struct srv6_counters)
 *     private to each program instance; the host reads it with loader.read_counters(prog_id).
 *     Semantics follow seg6local's `count` (net/ipv6/seg6_local.c seg6_local_input_core):
 *     packets/bytes of packets the behaviour processed (bytes = skb->len at entry, the L3
 *     length), errors = packets the behaviour dropped.
 *   - SRV6_TUNSRC_MAP(): the per-node tunnel-source map "tunsrc" (ARRAY, key __u32, value
 *     struct srv6_tunsrc, 2 entries). The loader creates one per node and shares its fd with
 *     all the node's programs (bpf_map__reuse_fd). Key SRV6_TUNSRC_SET (0): the address of
 *     `ip sr tunsrc set`, all zero = unset. Key SRV6_TUNSRC_DEFAULT (1): the node's default
 *     source, set by the host, used when neither key 0 nor the route's own source is set.
 *     Key SRV6_NODE_GSO_IFINDEX (2): first 4 bytes = ifindex (host order) of the node's GSO
 *     helper device (encap_gso.c), 0 = none. Only the encap programs use this map.
 *   - small packet helpers (IPv6 header / SRH layout from the uapi headers).
 */
#ifndef ANIBENCH_SRV6_H
#define ANIBENCH_SRV6_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/in6.h>
#include <linux/ipv6.h>
#include <linux/ip.h>
#include <linux/seg6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef NEXTHDR_ROUTING
#define NEXTHDR_ROUTING 43
#endif
#define SRV6_ETH_P_IP 0x0800
#define SRV6_ETH_P_IPV6 0x86DD
#define SRV6_IPPROTO_IPIP 4
#define SRV6_IPPROTO_IPV6 41
#define SRV6_SRH_TYPE 4

/* Most segments an SRH we push may carry: 40 + 8 + 16 * 13 = 256 = LWT_BPF_MAX_HEADROOM
 * (net/core/lwt_bpf.c), the most bpf_lwt_push_encap accepts. */
#define SRV6_MAX_SEGS 13
#define SRV6_MAX_ENCAP (40 + 8 + 16 * SRV6_MAX_SEGS)

struct srv6_counters {
	__u64 packets;
	__u64 bytes;
	__u64 errors;
};

#define SRV6_TUNSRC_SET 0
#define SRV6_TUNSRC_DEFAULT 1
#define SRV6_NODE_GSO_IFINDEX 2
#define SRV6_NODE_ENTRIES 3

struct srv6_tunsrc {
	struct in6_addr addr;
};

#define SRV6_COUNTERS()                                         \
	struct {                                                \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);        \
		__uint(max_entries, 1);                         \
		__type(key, __u32);                             \
		__type(value, struct srv6_counters);            \
	} counters SEC(".maps")

#define SRV6_TUNSRC_MAP()                                       \
	struct {                                                \
		__uint(type, BPF_MAP_TYPE_ARRAY);               \
		__uint(max_entries, SRV6_NODE_ENTRIES);         \
		__type(key, __u32);                             \
		__type(value, struct srv6_tunsrc);              \
	} tunsrc SEC(".maps")

/* Count one processed packet of `len` bytes (ok) or one dropped packet (!ok). Needs
 * SRV6_COUNTERS() in the object. */
#define SRV6_COUNT(ok, len)                                             \
	do {                                                            \
		__u32 _k = 0;                                           \
		struct srv6_counters *_c = bpf_map_lookup_elem(&counters, &_k); \
		if (_c) {                                               \
			if (ok) {                                       \
				_c->packets++;                          \
				_c->bytes += (len);                     \
			} else {                                        \
				_c->errors++;                           \
			}                                               \
		}                                                       \
	} while (0)

#endif /* ANIBENCH_SRV6_H */
