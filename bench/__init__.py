"""Live benchmarks for schedproj: ``python -m bench.run`` (see bench/README.md).

Real Redis (a private ``redis-server`` per run, on loopback) and real Celery processes; each
comparison is measured side by side in one run and reported as medians and ratios.
"""
