"""The benchmark suite: django-pgqueue against its peers and the pgbench ceiling.

Run it with ``make bench`` or ``python bench/run.py``; see bench/README.md.
"""
