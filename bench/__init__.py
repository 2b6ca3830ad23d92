"""Benchmarks for django-pgjobs, side by side with the queues a Django team would otherwise pick.

``python -m bench.run`` (or ``make bench``) prints the figures; ``python -m bench.soak`` (or
``make soak``) keeps a sustained load and prints how the table and the claim age over time.
"""
