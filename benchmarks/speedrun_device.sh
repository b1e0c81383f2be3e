#!/usr/bin/env bash
# The speedrun on a lent GPU (see benchmarks/README.md, "Speedrun"): run from the repository root with MNIST in
# data/mnist/MNIST/raw/*.gz (the device tool carries data/mnist). Everything the run writes goes to a scratch folder
# (WORK); every 10 s the exported checkpoints (fp16) and one meta.tar.gz (speedrun.json, the log, the registry
# entries, the histories) are copied to OUT, so that a run stopped by the call's time limit still returns what
# finished.   usage: OUT=... bash benchmarks/speedrun_device.sh MINUTES [speedrun args...]
set -u
minutes=${1:?minutes}
shift
OUT=${OUT:?set OUT}
WORK=${WORK:-$([ -w /dev/shm ] && echo /dev/shm/speedrun || echo /tmp/speedrun)}
PY=${PY:-$(command -v python3 || command -v python)}
mkdir -p "$OUT" "$WORK"
export CAPSULE_DATA="$PWD/data"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$WORK/nvidia-smi.txt" 2>&1
"$PY" -m capsule_lib.train.speedrun --minutes "$minutes" --out "$WORK" --overwrite --offline "$@" > "$WORK/speedrun.log" 2>&1 &
pid=$!
sync_out() {
    cp -u "$WORK"/checkpoints/*.pt "$OUT"/ 2>/dev/null
    (cd "$WORK" && tar -czf "$OUT/meta.tgz.part" $(ls speedrun.json speedrun.log nvidia-smi.txt checkpoints/registry.json \
        checkpoints/*.history.json 2>/dev/null)) && mv "$OUT/meta.tgz.part" "$OUT/meta.tar.gz"
}
while kill -0 "$pid" 2>/dev/null; do
    sleep 10
    sync_out
done
wait "$pid"
echo "speedrun exit code: $?" >> "$WORK/speedrun.log"
sync_out
tail -n 12 "$WORK/speedrun.log"
