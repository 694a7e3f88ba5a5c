"""``mizuoto bench``: load time, real-time factor, time to first audio and peak memory of a
model, each measured configuration in a fresh child process, configurations alternating run by
run (see docs/performance.md).

- :mod:`~mizuoto.benchmarking.spec`: what one child runs (``RunSpec``), as JSON.
- :mod:`~mizuoto.benchmarking.child`: the measurement inside the child (Mizuoto or upstream).
- :mod:`~mizuoto.benchmarking.runner`: configurations, the alternating schedule, the children.
- :mod:`~mizuoto.benchmarking.report`: min/median/max, ratios, the table and the JSON document.
- :mod:`~mizuoto.benchmarking.command`: the ``mizuoto bench`` command.

Nothing here imports torch until a child measures.
"""
