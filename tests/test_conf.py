"""Settings read at call time, and read by their rules."""

from __future__ import annotations

import pytest

from django_pgjobs.conf import DEFAULT_LEASE_SECONDS, checked
from django_pgjobs.exceptions import InvalidSetting


def test_a_checked_setting_is_its_value_or_its_default(settings) -> None:
    settings.PGJOBS_LEASE_SECONDS = 90
    assert checked("LEASE_SECONDS") == 90
    del settings.PGJOBS_LEASE_SECONDS
    assert checked("LEASE_SECONDS") == DEFAULT_LEASE_SECONDS


def test_a_checked_setting_its_rule_refuses_raises_the_error_naming_it(settings) -> None:
    settings.PGJOBS_METRICS_MAX_QUEUES = 0
    with pytest.raises(InvalidSetting) as refused:
        checked("METRICS_MAX_QUEUES")
    assert str(refused.value) == (
        "PGJOBS_METRICS_MAX_QUEUES must be a whole number from 1 to 10000, got 0 "
        "(manage.py check reports it as pgjobs.E010)")
    assert refused.value.setting == "PGJOBS_METRICS_MAX_QUEUES"
