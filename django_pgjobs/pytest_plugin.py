"""pytest fixtures for projects that use django-pgjobs, registered by a ``pytest11`` entry point.

Installing django-pgjobs makes them available to every test of a project that runs pytest with
pytest-django; nothing needs adding to ``conftest.py``. See docs/testing.md.

pytest imports this module when it starts, before pytest-django has configured Django, so it
imports nothing of Django's or of django_pgjobs' models at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing import Helpers


@pytest.fixture
def pgjobs(db: None) -> Helpers:
    """The helpers of ``django_pgjobs.testing`` on the default database.

    ``pgjobs.assert_enqueued(...)``, ``pgjobs.refute_enqueued(...)``,
    ``pgjobs.enqueued_jobs(...)``, ``pgjobs.drain(...)`` and ``pgjobs.ANY``. Asks for
    pytest-django's ``db``, so a test that uses it may touch the database; with
    ``@pytest.mark.django_db(transaction=True)`` or ``transactional_db`` it runs in a
    ``TransactionTestCase`` instead of the test's own transaction, and ``drain`` works in both.
    """
    # Imported here, not at the top: the helpers import the models, which Django can load only
    # once pytest-django has set it up, after pytest loaded this plugin.
    from .testing import Helpers

    return Helpers()
