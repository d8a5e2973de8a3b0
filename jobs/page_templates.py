"""The template backend of every page: Django's, except that a rendered page is always text.

A lone UTF-16 surrogate cannot be encoded as UTF-8, so one in anything a page shows fails the
whole response with a 500. The console refuses such text at the door (jobs.text), but a job
stored before that rule may still hold one in its arguments, variables or rules (JSON columns
kept it): the page shows it as U+FFFD instead. One pass of a compiled pattern over the page.
"""

from typing import Any

from django.template import TemplateDoesNotExist
from django.template.backends.django import DjangoTemplates, Template, reraise
from django.utils.safestring import SafeData, mark_safe

from jobs.text import shown


class PageTemplate(Template):
    def render(self, context: Any = None, request: Any = None) -> str:
        page = super().render(context, request)
        fixed = shown(page)
        if fixed is page:
            return page
        return mark_safe(fixed) if isinstance(page, SafeData) else fixed  # noqa: S308 (was safe)


class PageTemplates(DjangoTemplates):
    def from_string(self, template_code: str) -> PageTemplate:
        return PageTemplate(self.engine.from_string(template_code), self)

    def get_template(self, template_name: str) -> PageTemplate:
        try:
            return PageTemplate(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)
