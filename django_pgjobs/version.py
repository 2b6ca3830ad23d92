"""The package's version, said once: ``pyproject.toml`` reads it from here, and a worker's row
(``workers``) and its spans (``tracing``) say it without asking the installed metadata, which
costs a worker some 30 ms of CPU at start."""

VERSION = "0.1.0"
