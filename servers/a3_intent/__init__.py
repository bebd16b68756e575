"""ANI level A3-T: typed transactional service intent (draft section 5.1, Table 1: "cross-device
workflow transaction, active validation, rollback").

``catalog`` (typed service classes and change-set operations), ``inventory`` (records and the
resources found on the devices), ``planner`` (pure: validation, allocation, per-device changes,
validation scope), ``transaction`` (locks, snapshot, apply, active validation, rollback, commit)
and ``server`` (the MCP tools).
"""
