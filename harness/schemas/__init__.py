"""JSON Schemas of the export formats (``harness export``), generated from :mod:`harness.export`'s
models: regenerate with ``python -m harness.export`` after changing them (a test checks they match)."""
