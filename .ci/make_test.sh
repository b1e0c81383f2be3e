#!/usr/bin/env bash
# `make test`: the project's whole check, in five steps (see book/appendix/building.md).
#
#   0. lint                  ruff check . && ruff format --check .   (configured in pyproject.toml)
#   1. unit tests            pytest tests
#   2. notebooks, nbval      CAPSULE_SMOKE=1 pytest --nbval-lax book/
#   3. notebooks, papermill  papermill <chapter> _build/papermill/<chapter> -p SMOKE True, with an empty
#                            data root and CAPSULE_OFFLINE=1 (the offline path, generated stand-ins)
#   4. book build            jupyter-book build . --all -W -n --keep-going (chapters executed, TRAIN off;
#                            book/_tools/build_report.py fails it if a notebook raised;
#                            book/_ext/offline_book.py fails it if a page would fetch from the network), then
#                            book/_tools/screenshots.py opens every page in Chromium (no request may leave the
#                            machine, math typeset, images/widgets rendered; screenshots in _build/screenshots)
#
# Every step runs even if an earlier one failed, so one run shows every problem; the exit status is non-zero
# if any step failed. Logs go to _build/test-logs/. The last line printed is the unit tests' pytest summary
# line (step 1), so CI parsers read the unit-test counts last.
#
# Environment (exported by the Makefile): CAPSULE_DATA (data root). If it holds no MNIST, CAPSULE_OFFLINE=1
# is set here so every chapter runs on generated stand-ins (and says so).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="$ROOT/.venv/bin"
export PATH="$BIN:$PATH"
LOGS="$ROOT/_build/test-logs"
mkdir -p "$LOGS" "$ROOT/_build/papermill"

: "${CAPSULE_DATA:=$ROOT/data}"
export CAPSULE_DATA
if ! compgen -G "$CAPSULE_DATA/mnist/MNIST/raw/train-images-idx3-ubyte*" >/dev/null; then
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

mapfile -t NOTEBOOKS < <(find book -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort)

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

papermill_all() {
    # The offline path, on every run: an empty data root and CAPSULE_OFFLINE=1, so every chapter runs on the
    # generated stand-ins (nbval, step 2, runs them on the data under CAPSULE_DATA).
    local rc=0 nb out empty
    empty=$(mktemp -d)
    export CAPSULE_DATA="$empty" CAPSULE_OFFLINE=1
    echo "papermill: offline path: CAPSULE_DATA=$empty (empty), CAPSULE_OFFLINE=1"
    for nb in "${NOTEBOOKS[@]}"; do
        out="_build/papermill/${nb#book/}"
        mkdir -p "$(dirname "$out")"
        echo "papermill $nb -> $out"
        if ! papermill "$nb" "$out" -p SMOKE True --cwd "$(dirname "$nb")" --kernel python3 \
                --no-progress-bar --execution-timeout 900 --log-level WARNING; then
            echo "papermill: FAILED $nb"
            rc=1
        fi
    done
    echo "papermill: ${#NOTEBOOKS[@]} notebook(s), $([ $rc = 0 ] && echo 'all executed' || echo 'some FAILED')"
    return $rc
}

build_book() {
    # --all: a fresh Sphinx environment, so every page is re-read and every warning reported again;
    # executed notebooks still come from the (guarded) jupyter-cache.
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

run_step "0 lint (ruff check, ruff format --check)" "$LOGS/0-lint.log" lint
run_step "1 unit tests (pytest tests)" "$LOGS/1-pytest.log" python -m pytest tests
run_step "2 nbval (CAPSULE_SMOKE=1)" "$LOGS/2-nbval.log" \
    env CAPSULE_SMOKE=1 python -m pytest --nbval-lax --nbval-cell-timeout=900 -p no:cacheprovider "${NOTEBOOKS[@]}"
run_step "3 papermill (-p SMOKE True, offline)" "$LOGS/3-papermill.log" papermill_all
run_step "4 book build (--all -W -n --keep-going)" "$LOGS/4-book.log" build_book

echo
echo "================================ make test: summary ================================"
failed=0
for i in "${!NAMES[@]}"; do
    status=ok; [ "${RCS[$i]}" = 0 ] || { status="FAILED (exit ${RCS[$i]})"; failed=1; }
    printf '  %-40s %5ss  %s\n' "${NAMES[$i]}" "${SECS[$i]}" "$status"
done
echo "  logs: $LOGS/"
[ $failed = 0 ] && echo "make test: all steps passed" || echo "make test: FAILED"
summary=$(grep -E '^=+ .*(passed|failed|error|skipped|no tests ran|deselected).* in [0-9.]+s.* =+$' "$LOGS/1-pytest.log" | tail -n 1)
if [ -n "$summary" ]; then
    echo "$summary"
else
    echo "=== unit tests: no pytest summary line (pytest exited with ${RCS[1]}) ==="
fi
exit $failed
