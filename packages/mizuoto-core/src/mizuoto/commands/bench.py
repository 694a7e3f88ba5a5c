"""``mizuoto bench`` (and its hidden per-run child, ``bench-run``): the commands live beside
what they measure, in :mod:`mizuoto.benchmarking.command`; this module adds them to the group."""

from mizuoto.benchmarking.command import bench, bench_run

COMMANDS = (bench, bench_run)
