"""The eBPF SRv6 data plane: programs in ``bpf/*.c``, built by :mod:`.build`, loaded one
instance per route by :mod:`.loader` (host side; nodes never hold CAP_BPF)."""
