"""Template tags of the jobs admin."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import pagination

register = template.Library()


@register.inclusion_tag("django_pgqueue/admin/job/pagination.html")
def pgqueue_pagination(cl: Any) -> dict[str, Any]:
    """Django's changelist pagination, saying "about" when the count is an estimate (the
    paginator's, which grows as pages past the planner's estimate are reached)."""
    return {
        **pagination(cl),
        "estimated": getattr(cl.paginator, "count_is_estimate", False),
        "estimated_count": cl.paginator.count,
    }
