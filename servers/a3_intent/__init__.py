"""ANI level A3-T: typed transactional service intent (draft section 5.1, Table 1: "cross-device
workflow transaction, active validation, rollback").

``catalog`` (typed service classes and change-set operations), ``inventory`` (records and the
resources found on the devices), ``planner`` (pure: validation, allocation, per-device changes,
validation scope), ``transaction`` (locks, snapshot, pre-check, journal, apply, active validation
judging regressions, undo, commit, recovery of a dead server's transaction) and ``server`` (the
MCP tools). The device-level transaction machinery it stands on -- journal, before-state of the
items a change sets, undo, recovery, startup configuration -- is generic: :mod:`substrate.journal`.
"""
