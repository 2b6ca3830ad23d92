"""A module that only the test of enqueue-by-name imports: it must never be imported there."""

IMPORTED = True
