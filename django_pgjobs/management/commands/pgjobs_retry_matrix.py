"""manage.py pgjobs_retry_matrix: print (or write) docs/retry-matrix.md from the policy table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_pgjobs.retry import retry_matrix_markdown


class Command(BaseCommand):
    help = "Print the retry and terminal-state matrix generated from the policy table."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--write", type=Path, default=None, help="write it to this file")

    def handle(self, *args: Any, **options: Any) -> None:
        text = retry_matrix_markdown()
        if options["write"] is None:
            self.stdout.write(text, ending="")
        else:
            options["write"].write_text(text, encoding="utf-8")
            self.stdout.write(f"wrote {options['write']}")
