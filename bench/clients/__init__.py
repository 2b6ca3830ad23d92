"""One client module per system: the actions ``bench.measure`` runs, through each system's API."""
