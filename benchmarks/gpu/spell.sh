#!/usr/bin/env bash
# One lent GPU spell, as the device tool runs it from the repo root: the GPU check (benchmarks/gpu/smoke.py) within
# its budget, then its small results copied to $OUT (the model and run folders stay on the machine). Extra arguments
# replace its defaults (below) and go to smoke.py, e.g. `bash benchmarks/gpu/spell.sh --parts learning,speed,peer`.
set -u
results=${OUT:-runs}/gpu_smoke
mkdir -p "$results"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python3 -c "import sys, torch, transformers, accelerate, peft; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, accelerate.__version__, peft.__version__)"; } > "$results/device.txt" 2>&1
# with no arguments, one spell of the lent time: warm start, every script's plain run, the speed of the dynamic and
# static caches, the TRL peer, then every method against its baseline in what is left (--torch_compile's speed run,
# ~200 s of compiling, and the fsdp / gc_lora parts are left out: name them to run them)
[ $# -eq 0 ] && set -- --budget_s 520 --parts plain,speed,peer,learning --speed_runs dynamic,static
# the command's own budget ends it; the outer limit is only a backstop (SIGTERM: it saves and reports)
timeout -s TERM "${LIMIT_S:-550}" python3 benchmarks/gpu/smoke.py --output_dir /tmp/gpu_smoke "$@" 2>&1 \
  | grep --line-buffered -v "it/s]$" | tee "$results/log.txt"
rc=${PIPESTATUS[0]}
cp /tmp/gpu_smoke/smoke.json /tmp/gpu_smoke/smoke.md "$results/" 2>/dev/null
cp /tmp/gpu_smoke/learning.json /tmp/gpu_smoke/learning.png /tmp/gpu_smoke/peer/trl_peer.md \
  /tmp/gpu_smoke/peer/trl_peer.json "$results/" 2>/dev/null
cp /tmp/gpu_smoke/model-150m-warm/warm_start.json "$results/" 2>/dev/null
exit "$rc"
