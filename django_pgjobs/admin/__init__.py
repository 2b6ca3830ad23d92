"""The Django admin for django-pgjobs: read-only records, permissioned and audited actions.

``jobs`` registers the job admin (list, detail, raw payload, dashboard, actions), ``schedules``
the schedule admin (list, detail, operators' schedules, pause, resume, run now), ``records``
the attempt, receipt and audit admins, ``queues`` the queues page (pause, resume), ``limits``
the keys in use and operators' limits per key, ``workers`` the worker processes; ``actions``
is the table of operator actions, ``base`` what every admin shares (read-only, its own lookups
only), ``display`` and ``filters`` the pieces they show, ``dashboard`` the operations page.
"""

from . import jobs, limits, queues, records, schedules, workers
from .display import EstimatedCountPaginator, duration_text, planner_rows, time_text

__all__ = [
    "EstimatedCountPaginator", "duration_text", "jobs", "limits", "planner_rows", "queues",
    "records", "schedules", "time_text", "workers",
]
