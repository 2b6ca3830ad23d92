"""The console's template pieces: ``{% load pgjobs_console %}``.

``{% pgjobs_live %}`` puts the live-update control on a page (``PGJOBS_ADMIN_REFRESH_SECONDS``);
``{% pgjobs_style %}`` the console's styles.
"""

from __future__ import annotations

from typing import Any

from django import template

from ..conf import settings

register = template.Library()


@register.inclusion_tag("admin/pgjobs/live.html")
def pgjobs_live() -> dict[str, Any]:
    return {"live_seconds": float(settings.ADMIN_REFRESH_SECONDS)}


@register.inclusion_tag("admin/pgjobs/console_style.html")
def pgjobs_style() -> dict[str, Any]:
    return {}
