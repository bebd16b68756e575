"""ANI level A4: typed intent recorded in a reconciled source of truth (draft section 5.1)."""
