"""Job names of tasks: ``django.tasks:<module path>``, and the task a name stands for."""

from __future__ import annotations

import sys

from django.utils.module_loading import import_string

from ..registry import DJANGO_TASK_PREFIX
from .compat import Task


def task_name(task: Task) -> str:
    """The job name a task is enqueued under."""
    return DJANGO_TASK_PREFIX + task.module_path


def find_task(name: str, may_import: bool) -> Task | None:
    """The ``Task`` that job name ``name`` names; import its module only if ``may_import``."""
    if not name.startswith(DJANGO_TASK_PREFIX):
        return None
    path = name[len(DJANGO_TASK_PREFIX):]
    module_path, _, attribute = path.rpartition(".")
    if may_import:
        try:
            task = import_string(path)
        except ImportError:
            return None
    else:
        module = sys.modules.get(module_path)
        task = getattr(module, attribute, None) if module is not None else None
    return task if isinstance(task, Task) else None
