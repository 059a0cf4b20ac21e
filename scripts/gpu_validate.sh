#!/usr/bin/env bash
# One GPU session's validation run, from the repository root on a CUDA machine:
#   1. a workload, 2. the Vidur profile of the model on the GPU (timed),
#   3. the real bench (hf_cb) replaying that workload with NVML telemetry.
# Simulation and comparison run elsewhere from the returned run directories (profile once on the
# GPU, simulate anywhere). Wheels the GPU image lacks can be carried in .whl/ (see docs/gpu.md).
# Optional steps (STEPS, default "validate"): "nsys_probe" (can nsys make a report here; put the
# one that can on PATH), "deep_profile" (torch profiler + nsys + ncu on a few decode steps) and
# "fidelity" (the fidelity stage's real phase, the GPU half) and "capacity" (the capacity
# stage's real search, its GPU half).
#   STEPS="deep_profile fidelity" bash scripts/gpu_validate.sh
# Knobs: MODEL, HW, NUM_REQUESTS, QPS, CB_ARGS, FIDELITY_BACKEND, FIDELITY_EXPERIMENT, FIDELITY_ARGS, DP_ARGS
# (more overrides of the fidelity stage, e.g. fidelity.num_requests=24), STEP_TIMEOUT_S;
# results and logs go to $OUT (default tmp/gpu_out).
set -uo pipefail
MODEL=${MODEL:-qwen3_0_6b}
HW=${HW:-h100}
NUM_REQUESTS=${NUM_REQUESTS:-200}
QPS=${QPS:-4}
# CUDA graphs: an eager step is launch-bound and follows the host CPU's speed of the moment
# (benchmarks/results/h100_qwen3_0_6b_20261126)
CB_ARGS=${CB_ARGS:-backend.max_batch_tokens=512 backend.max_requests_per_batch=32 backend.num_blocks=4096 backend.use_cuda_graph=true}
OUT=${OUT:-tmp/gpu_out}
TAG=${TAG:-gpu}
STEPS=${STEPS:-validate}
# empty: the preset's engine and knobs (fidelity_qwen3_0_6b_h100: backend=hf_cb_h100); a name
# (hf_generate, hf_cb_h100, ...) replaces both (backend=hf_cb alone is hf_cb's CPU defaults)
FIDELITY_BACKEND=${FIDELITY_BACKEND:-}
FIDELITY_EXPERIMENT=${FIDELITY_EXPERIMENT:-fidelity_qwen3_0_6b_h100}
FIDELITY_ARGS=${FIDELITY_ARGS:-}
DP_ARGS=${DP_ARGS:-}  # more overrides of the deep profile, e.g. pipeline.ncu.enable=false
CAPACITY_ARGS=${CAPACITY_ARGS:-}  # more overrides of the capacity stage's real phase
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-530}  # one device call runs at most 600 s, set-up included
want() { [[ " $STEPS " == *" $1 "* ]]; }
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda); print("transformers", transformers.__version__)'
} | tee "$OUT/env.txt"

step() {  # step NAME CMD...: run, log to $OUT/NAME.log, record wall time
  # Ctrl-C after STEP_TIMEOUT_S (then a kill 30 s later), so a step that outlives the device
  # call's limit still leaves its runs (marked interrupted) and its tarball is still made
  local name=$1; shift
  local start=$SECONDS
  timeout -s INT -k 30 "$STEP_TIMEOUT_S" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - start))" | tee -a "$OUT/steps.txt"
  tail -25 "$OUT/$name.log"
  return $rc
}

if want validate; then
step workload python3 -m gpu_simulate_test.cli.workload model="$MODEL" output.run_id="$TAG-w" \
  workload.num_requests="$NUM_REQUESTS" workload.qps="$QPS" workload.prompt_len.min=64 \
  workload.prompt_len.max=512 workload.output_len.min=32 workload.output_len.max=256 progress=false
# the engine calibration runs the real bench's hf_cb with the same knobs (engine.backend.*)
# shellcheck disable=SC2086
step vidur_profile python3 -m gpu_simulate_test.cli.vidur_profile model="$MODEL" hardware="$HW" \
  workload_dir="tmp/workload/$TAG-w" output.run_id="$TAG-p" progress=false \
  engine.enable=true ${CB_ARGS//backend./engine.backend.}
# shellcheck disable=SC2086
step real_bench python3 -m gpu_simulate_test.cli.real_bench model="$MODEL" hardware="$HW" \
  backend=hf_cb $CB_ARGS workload_dir="tmp/workload/$TAG-w" output.run_id="$TAG-rb" progress=false

tar czf "$OUT/runs.tgz" tmp/workload tmp/profiles tmp/vidur_profile tmp/real_bench 2>/dev/null
fi

if want nsys_probe; then
  # can this machine make an Nsight Systems report? (scripts/nsys_probe.sh); the nsys that did
  # goes on PATH for the deep profile's own nsys step
  # nsys's QdstrmImporter needs libdw.so.1 (elfutils), which the GPU image lacks: carried .deb
  # files in .deb/ (e.g. `apt-get download libdw1 libelf1`) are unpacked beside, never into, /
  if compgen -G ".deb/*.deb" >/dev/null; then
    for f in .deb/*.deb; do dpkg -x "$f" /tmp/nsys_deps; done
    export LD_LIBRARY_PATH="/tmp/nsys_deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  bash scripts/nsys_probe.sh > "$OUT/nsys_probe.txt" 2>&1
  tail -8 "$OUT/nsys_probe.txt"
  found=$(sed -n 's/^NSYS_OK //p' "$OUT/nsys_probe.txt")
  [ -n "$found" ] && export PATH="$(dirname "$found"):$PATH"
fi

if want deep_profile; then
  # shellcheck disable=SC2086
  step deep_profile python3 -m gpu_simulate_test.cli.deep_profile model="$MODEL" hardware="$HW" \
    num_requests=2 workload.num_requests=2 workload.output_len.value=4 \
    pipeline.ncu.launch_count=20 pipeline.ncu.timeout_s=120 output.run_id="$TAG-dp" $DP_ARGS
  tar czf "$OUT/deep_profile.tgz" --exclude='*.ncu-rep' --exclude='*.sqlite' \
    "tmp/deep_profile/$TAG-dp" 2>/dev/null
fi

if want fidelity; then
  # the run directory is self-contained (runs/, profiles/, the manifest); here:
  #   tar xzf fid.tgz -C tmp/fid_gpu && python -m gpu_simulate_test.cli.fidelity \
  #     fidelity.phase=sim fidelity.real_from=tmp/fid_gpu/fidelity/$TAG-fid
  # shellcheck disable=SC2086
  step fidelity python3 -m gpu_simulate_test.cli.fidelity +experiment="$FIDELITY_EXPERIMENT" \
    ${FIDELITY_BACKEND:+backend="$FIDELITY_BACKEND"} fidelity.phase=real output.root="$OUT/fid" \
    output.run_id="$TAG-fid" progress=false $FIDELITY_ARGS
  tar czf "$OUT/fid.tgz" -C "$OUT/fid" fidelity 2>/dev/null && rm -rf "$OUT/fid"
fi
if want capacity; then
  # the real search only (issue 29); the run directory carries its bundle and manifest; here:
  #   tar xzf capacity.tgz -C tmp/cap_gpu && python -m gpu_simulate_test.cli.capacity \
  #     capacity.phase=sim capacity.real_from=tmp/cap_gpu/capacity/$TAG-cap
  # shellcheck disable=SC2086
  step capacity python3 -m gpu_simulate_test.cli.capacity model="$MODEL" hardware="$HW" \
    backend=hf_cb $CB_ARGS capacity.phase=real output.root="$OUT/cap" \
    output.run_id="$TAG-cap" progress=false $CAPACITY_ARGS
  # the served model's weights and the engine's compile cache stay: the sim phase reads neither
  tar czf "$OUT/capacity.tgz" --exclude='*/runs/models' --exclude='*/runs/cache' \
    -C "$OUT/cap" capacity 2>/dev/null && rm -rf "$OUT/cap"
fi
echo "---- summary ----"
cat "$OUT/steps.txt"
