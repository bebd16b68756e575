"""ANI level A3-R: a reconciled source of truth (Git repository of service records) and its reconciler."""
