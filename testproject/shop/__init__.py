"""A sample application: orders charged by a job, receipts sent by a django.tasks task.

It is here to be tested the way an application using django-pgjobs would test itself, with
django_pgjobs.testing (see its tests/ and docs/testing.md).
"""
