"""Argument types shared by the management commands: each refuses a bad value by saying why."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from django_pgjobs.validation import poll_interval_problem, queue_problem, text_problem


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number of at least ``low`` (and at most ``high``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def seconds(low: float, high: float, *, low_inclusive: bool = True) -> Callable[[str], float]:
    """A finite number of seconds between ``low`` and ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        above_low = value >= low if low_inclusive else value > low
        if not math.isfinite(value) or not above_low or value > high:
            span = (f"from {low:g} to {high:g}" if low_inclusive
                    else f"more than {low:g} and at most {high:g}")
            raise argparse.ArgumentTypeError(f"must be {span} seconds, got {text}")
        return value

    return parse


def poll_interval(text: str) -> float:
    """Seconds between an idle worker's polls, by the rule of PGJOBS_POLL_INTERVAL_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    problem = poll_interval_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def queue_name(text: str) -> str:
    """A queue name, by the one rule enqueue and the models use."""
    problem = queue_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"the queue {problem}")
    return text


def label(max_length: int) -> Callable[[str], str]:
    """A name that goes into log lines and database rows: no control characters."""

    def parse(text: str) -> str:
        problem = text_problem(text, max_length)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    return parse
