#!/usr/bin/env bash
# Real GPU validation in one command (issue 6): every fixture scenario on CUDA beside its rehearsal,
# capture overhead and dump time. Results go to $OUT (summary.json, log.txt, results.tar.gz);
# bring them home with benchmarks/gpu/import_results.py. See docs/gpu-validation.md.
#
#   OUT=/some/folder bash benchmarks/gpu/run_all.sh [driver.py options]
#
# Wheels in .whl/ (oomdoctor's dependencies the machine lacks, e.g. orjson) are installed into a
# private folder first; nothing is downloaded.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/oomdoctor-site .whl/*.whl || echo "run_all.sh: installing .whl/ failed" >&2
    export PYTHONPATH="/tmp/oomdoctor-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export GPU_VALIDATION_COMMAND="bash benchmarks/gpu/run_all.sh${*:+ $*}"  # the provenance of every dump
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
# The driver keeps to its own budget (--budget-s, 360 s: it starts no run after that) and packs
# what it has when stopped; this timeout is the last resort, inside the device call's timeout_s.
timeout --signal=TERM --kill-after=20 450 "$PYTHON" benchmarks/gpu/driver.py --out "$OUT" "$@"
status=$?
ls -la "$OUT"
exit $status
