"""ANI level A2: NETCONF/YANG through ncclient (see server.py)."""
