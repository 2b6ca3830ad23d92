"""The multi-worker failure harness: real workers, real faults, checked invariants."""
