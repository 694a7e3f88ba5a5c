#!/usr/bin/env bash
# The wheel folder for the GPU check (benchmarks/gpu/checks.py), built here where PyPI is
# reachable: the device machine reaches no registry and receives at most 64 MiB of ignored
# files beside the work tree, so everything the check installs there travels in .whl/ (ignored
# by git; the run names it in `carry`). See docs/gpu-check.md.
#
#   benchmarks/gpu/wheels.sh [DIR]     # default .whl/ in the repository root
#
# Mizuoto's four distributions are built from this checkout; the rest are carried-wheels.txt's
# pins (CI's resolved versions), for Python 3.12 on x86-64 Linux (the device's). A source-only
# release (encodec, argbind) is built into a wheel here. Fails if the folder passes 40 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.whl}"
PYTHON="${PYTHON:-python3}"
if [ "$out" = .whl ]; then
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
rm -rf "$out" && mkdir -p "$out"
# Mizuoto itself (pure Python), and the contract suite: the parity tests' pytest plugin
"$PYTHON" -m pip wheel -q --no-deps -w "$out" ./packages/mizuoto-core ./packages/mizuoto-f5tts \
    ./packages/mizuoto-voxcpm ./contract-tests
platforms=(--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
# pins marked "source only" have no wheel on PyPI (pure-Python sdists): built into one here
pins() { grep -v '^\s*#' benchmarks/gpu/carried-wheels.txt | grep "$@" | sed 's/#.*//; s/\s*$//' | grep .; }
mapfile -t binary < <(pins -v 'source only')
mapfile -t source < <(pins 'source only')
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: "${platforms[@]}" -d "$out" \
    "${binary[@]}"
"$PYTHON" -m pip wheel -q --no-deps --no-binary=:all: -w "$out" "${source[@]}"
bytes=$(du -sb "$out" | cut -f1)
echo "$(ls "$out" | wc -l) wheels, $((bytes / 1000000)) MB in $out"
if [ "$bytes" -gt 40000000 ]; then
    echo "the wheel folder is over 40 MB: the device carries 64 MiB with the work tree" >&2
    exit 1
fi
