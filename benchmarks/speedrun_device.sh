#!/usr/bin/env bash
# The speedrun on a lent GPU, as the book's first speedruns were run (benchmarks/README.md, "Speedrun"): now
# `benchmarks/gpu_items.py speedrun`, which reads MNIST from the staged piece stage/m (benchmarks/gpu_stage.py) and
# copies the exports and one meta.tar.gz to $OUT every 10 s ("Runs on a lent GPU").
#   usage: OUT=... bash benchmarks/speedrun_device.sh MINUTES RECIPE... [speedrun options]
exec "${PY:-$(command -v python3 || command -v python)}" -u "$(dirname "$0")/gpu_items.py" speedrun "$@"
