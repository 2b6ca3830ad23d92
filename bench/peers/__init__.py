"""The peers measured next to django-pgjobs, each driven through its own public API."""
