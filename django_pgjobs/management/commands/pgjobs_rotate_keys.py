"""manage.py pgjobs_rotate_keys: seal every encrypted value under the first configured key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs import encryption
from django_pgjobs.exceptions import EncryptionNotConfigured, RotationStalled
from django_pgjobs.management.arguments import whole_number
from django_pgjobs.rotation import rotate_keys, stale_values

DEFAULT_BATCH = 500


class Command(BaseCommand):
    help = (
        "Seal every encrypted payload, result and receipt value again under the first key of "
        "PGJOBS_ENCRYPTION_KEYS, in batches, while workers run; then say whether any value is "
        "left under another key (the old key can be removed once none is)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=whole_number(1), default=DEFAULT_BATCH,
                            help=f"rows read per statement (default {DEFAULT_BATCH})")
        parser.add_argument("--check", action="store_true",
                            help="count the values under keys other than the first; change "
                                 "nothing; exit 1 if there are any")
        parser.add_argument("--generate-key", action="store_true",
                            help="print a new key for PGJOBS_ENCRYPTION_KEYS and exit")
        parser.add_argument("--database", default="default", help="database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["generate_key"]:
            self.stdout.write(encryption.new_key())
            return
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database alias {using!r}")
        batch = options["batch_size"]
        try:
            if not options["check"]:
                done = rotate_keys(batch=batch, using=using)
                self.stdout.write(
                    f"read {done.rows_read} rows; sealed {done.values_resealed} values again "
                    f"in {done.rows_written} rows under key {encryption.keyring().primary}")
                for table, row_id, why in done.unopened:
                    self.stderr.write(f"pgjobs_{table} {row_id}: {why}")
            stale = stale_values(batch=batch, using=using)
        except EncryptionNotConfigured as exc:
            raise CommandError(str(exc)) from None
        except RotationStalled as exc:
            raise CommandError(f"{exc}; run pgjobs_rotate_keys again to go on") from None
        if stale:
            listed = ", ".join(f"{count} under key {key}" for key, count in sorted(stale.items()))
            raise CommandError(f"encrypted values left under other keys: {listed}")
        self.stdout.write("no encrypted value is left under another key")
