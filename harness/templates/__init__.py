"""Protocol templates in the spirit of NetConfArena (seed 000, section IV-D): one YAML file per
template (``harness/templates/library/*.yaml``; the format: :mod:`harness.templates.schema`),
instantiated on a live scenario by Algorithm 1 (:mod:`harness.templates.instantiate`) against
its value registry (:mod:`harness.templates.registry`), run as task variants
(:mod:`harness.templates.tasks`)."""

from harness.templates.schema import InstantiationRefused, Template, TemplateError, load_template, parse_template

__all__ = ["InstantiationRefused", "Template", "TemplateError", "load_template", "parse_template"]
