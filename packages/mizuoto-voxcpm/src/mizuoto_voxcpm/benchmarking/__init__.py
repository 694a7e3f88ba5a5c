"""Benchmark-only code: the upstream voxcpm driver for ``mizuoto bench --against-upstream``.

Nothing in Mizuoto's runtime imports this package; ``upstream`` is imported only in the
benchmark's upstream child process.
"""
