#!/usr/bin/env bash
# `make test`: the project's whole check, in five steps (see book/appendix/building.md).
#
#   0. lint          ruff check . && ruff format --check .   (configured in pyproject.toml)
#   1. unit tests    pytest -n JOBS --dist loadfile tests   (pytest-xdist: one worker per core, each test file on one
#                    worker; each worker runs torch with one intra-op thread, see tests/conftest.py)
#   2. notebooks     book/_tools/execute.py: every chapter executed once per data path, JOBS at a time:
#                    (a) as the book shows it (TRAIN off) on the data under CAPSULE_DATA, stored in the book's
#                    execution cache for step 3; (b) under papermill with -p SMOKE True, an empty data root and
#                    CAPSULE_OFFLINE=1 (the offline path: generated stand-ins; executed copies in _build/papermill/)
#   3. book build    jupyter-book build . --all -W -n --keep-going, on step 2's executions (a chapter is executed
#                    again only if it failed there; book/_tools/build_report.py fails the step if a notebook raised,
#                    book/_ext/offline_book.py if a page would fetch from the network), then book/_tools/screenshots.py
#                    opens every page in Chromium (no request may leave the machine, math typeset, images/widgets
#                    rendered, tables and figures within the content column; screenshots in _build/screenshots)
#   4. no-data path  the reader's first run: a fresh machine without data, after a build that tried to download
#                    MNIST and failed (torchvision leaves an empty mnist/MNIST/raw/). The real-data tests
#                    (pytest -m realdata: every test that takes the real_data fixture) run on a temporary data root
#                    holding that debris and must all skip, saying why (seconds)
#
# Every step runs even if an earlier one failed, so one run shows every problem; the exit status is non-zero
# if any step failed. Logs go to _build/test-logs/; the step and notebook times to _build/test-logs/ci_times.json
# (benchmarks/ci_times.py adds a clean-clone run's to benchmarks/results/ci_times.json). The last line printed is
# the unit tests' pytest summary line (step 1), so CI parsers read the unit-test counts last.
#
# Environment (exported by the Makefile): CAPSULE_DATA (data root). If it holds no real MNIST (as its files say:
# capsule_lib.data.find_real_data, the one answer the library and the tests' real_data fixture use), CAPSULE_OFFLINE=1
# is set here so every chapter runs on generated stand-ins (and says so). JOBS: parallel jobs (default: the CPUs).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="$ROOT/.venv/bin"
export PATH="$BIN:$PATH"
LOGS="$ROOT/_build/test-logs"
mkdir -p "$LOGS"
JOBS="${JOBS:-$(nproc)}"
T_START=$SECONDS

: "${CAPSULE_DATA:=$ROOT/data}"
export CAPSULE_DATA
if ! python -c 'import sys; from capsule_lib.data import find_real_data; sys.exit(not find_real_data("mnist", sys.argv[1]))' \
    "$CAPSULE_DATA" 2>/dev/null; then
    export CAPSULE_OFFLINE=1
    echo "make test: no MNIST under $CAPSULE_DATA -> CAPSULE_OFFLINE=1 (generated stand-in data)"
else
    echo "make test: real data from $CAPSULE_DATA"
fi

# Debian's chromium for the browser test (tests/test_e2e_widgets.py) and `make screenshots`.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "make test: installing chromium (apt-get)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >"$LOGS/apt.log" 2>&1 \
            || echo "make test: WARNING: could not install chromium (see $LOGS/apt.log); the browser test will be skipped"
    else
        echo "make test: chromium missing and not root: the browser test will be skipped"
    fi
fi

declare -a NAMES=() RCS=() SECS=()
run_step() {  # run_step <name> <log> <command...>
    local name=$1 log=$2; shift 2
    echo
    echo "================================ make test: $name ================================"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    NAMES+=("$name"); RCS+=("$rc"); SECS+=($((SECONDS - t0)))
    return 0
}

build_book() {
    # --all: a fresh Sphinx environment, so every page is re-read and every warning reported again; the executed
    # notebooks come from the (guarded) jupyter-cache that step 2 filled.
    python book/_tools/cache_guard.py && python book/_tools/build_report.py --clean || return 1
    local rc=0
    jupyter-book build . --all -W -n --keep-going || rc=1
    python book/_tools/build_report.py || rc=1   # a notebook that raised fails the step, named with its cell
    [ $rc = 0 ] || return 1
    # the built pages in a real browser: no network request, math typeset, images and widgets rendered
    if [ -x /usr/bin/chromium ]; then
        python book/_tools/screenshots.py --html _build/html --out _build/screenshots
    else
        echo "chromium missing: skipped the browser check of the built pages"
    fi
}

lint() { ruff check . && ruff format --check .; }

no_data_path() {
    local root rc=0 log
    root=$(mktemp -d) && mkdir -p "$root/mnist/MNIST/raw" || return 1
    # shellcheck disable=SC2046  # the test files that use the real_data fixture, one word each
    log=$(CAPSULE_DATA="$root" python -m pytest -q -rs -p no:cacheprovider -m realdata \
        $(grep -l "real_data" tests/test_*.py) 2>&1) || rc=1
    rm -rf "$root"
    echo "$log"
    [ $rc = 0 ] || return 1
    if ! tail -n 1 <<<"$log" | grep -Eq '^[0-9]+ skipped(, [0-9]+ deselected)? in '; then
        echo "no-data path: the real-data tests must all skip on a data root without MNIST"
        return 1
    fi
    grep -q "real MNIST not present under CAPSULE_DATA=" <<<"$log" || { echo "no-data path: no skip reason"; return 1; }
}

run_step "0 lint (ruff check, ruff format --check)" "$LOGS/0-lint.log" lint
run_step "1 unit tests (pytest -n $JOBS)" "$LOGS/1-pytest.log" python -m pytest -n "$JOBS" --dist loadfile tests
run_step "2 notebooks (book + offline paths)" "$LOGS/2-notebooks.log" \
    python book/_tools/execute.py --jobs "$JOBS" --times "$LOGS/notebook_times.json"
run_step "3 book build (--all -W -n --keep-going)" "$LOGS/3-book.log" build_book
run_step "4 no-data path (real-data tests skip)" "$LOGS/4-no-data.log" no_data_path
TOTAL=$((SECONDS - T_START))

echo
echo "================================ make test: summary ================================"
failed=0
steps_json=""
for i in "${!NAMES[@]}"; do
    status=ok; [ "${RCS[$i]}" = 0 ] || { status="FAILED (exit ${RCS[$i]})"; failed=1; }
    printf '  %-40s %5ss  %s\n' "${NAMES[$i]}" "${SECS[$i]}" "$status"
    steps_json+="${steps_json:+, }\"${NAMES[$i]}\": ${SECS[$i]}"
done
printf '  %-40s %5ss\n' "total" "$TOTAL"
summary=$(grep -E '^=+ .*(passed|failed|error|skipped|no tests ran|deselected).* in [0-9.]+s.* =+$' "$LOGS/1-pytest.log" | tail -n 1)
python - "$LOGS" "$TOTAL" "$failed" "$summary" "{${steps_json}}" <<'PY' || true
import json, sys, pathlib
logs, total, failed, summary, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] != "0", sys.argv[4], json.loads(sys.argv[5])
nb = logs / "notebook_times.json"
out = {"steps_s": steps, "total_s": total, "passed": not failed, "unit_tests": summary.strip("= ")}
out["notebooks_s"] = json.loads(nb.read_text()) if nb.exists() else {}
(logs / "ci_times.json").write_text(json.dumps(out, indent=1) + "\n")
PY
echo "  logs: $LOGS/ (times: $LOGS/ci_times.json)"
[ $failed = 0 ] && echo "make test: all steps passed" || echo "make test: FAILED"
if [ -n "$summary" ]; then
    echo "$summary"
else
    echo "=== unit tests: no pytest summary line (pytest exited with ${RCS[1]}) ==="
fi
exit $failed
