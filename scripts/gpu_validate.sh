#!/usr/bin/env bash
# One GPU session from the repository root on a CUDA machine, planned to fit the window: every
# step has a budget in seconds, printed with the plan's sum before anything runs; the step runs
# under that budget as its timeout (and the stage gets it where it has a knob for it: the capacity
# stage's capacity.verify_budget_s), and its wall time is printed after it.
# Steps (STEPS, default "workload profile fidelity capacity"):
#   workload   the presets' length mix (workload=gpu_chat; cpu_chat on CPU) for the profile to cover
#   profile    the Vidur profile and engine calibration (+experiment=profile_<preset>), the bundle
#              the fidelity and capacity steps reuse (into tmp/profiles)
#   fidelity   the fidelity stage's real phase (+experiment=fidelity_<preset>), the GPU half
#   capacity   the capacity stage's real phase (+experiment=capacity_<preset>), the GPU half
#   real_bench the real bench on the workload (validate = "workload profile real_bench")
#   nsys_probe can nsys make a report here; deep_profile: torch profiler + nsys + ncu
# Simulation and comparison run elsewhere from the returned run directories (docs/gpu.md).
# One device command runs at most 10 minutes: a plan over CALL_LIMIT_S is split across calls,
# e.g. STEPS="workload profile fidelity", then STEPS=capacity on the still-warm machine (its
# tmp/profiles is kept between calls there).
#   MODEL=qwen3_0_6b HW=h100 OUT=/some/dir bash scripts/gpu_validate.sh
#   MODEL=qwen3_tiny HW=cpu bash scripts/gpu_validate.sh      # the dry run: every step, on CPU
# Knobs: MODEL, HW, STEPS, NUM_REQUESTS, QPS, TAG, OUT (default tmp/gpu_out); presets
# PROFILE_EXPERIMENT, FIDELITY_EXPERIMENT, CAPACITY_EXPERIMENT; more overrides FIDELITY_ARGS,
# CAPACITY_ARGS, DP_ARGS; FIDELITY_BACKEND (another engine for the fidelity step); budgets
# BUDGET_<STEP>_S (e.g. BUDGET_CAPACITY_S=300), CAPACITY_SETUP_S (of the capacity step's budget,
# what is not its real search's), CALL_LIMIT_S, WINDOW_S; PLAN_ONLY=1 prints the plan and stops.
set -uo pipefail
MODEL=${MODEL:-qwen3_0_6b}
HW=${HW:-h100}
STEPS=${STEPS:-workload profile fidelity capacity}
STEPS=${STEPS//validate/workload profile real_bench}
OUT=${OUT:-tmp/gpu_out}
TAG=${TAG:-gpu}
if [ "$HW" = cpu ]; then
  # the dry run: tiny Qwen3 against hf_cb on CPU, every step sized to check the plumbing
  PRESET=cpu_tiny WORKLOAD=cpu_chat BACKEND=hf_cb_cap8
  NUM_REQUESTS=${NUM_REQUESTS:-20}
  FIDELITY_ARGS=${FIDELITY_ARGS:-fidelity.loads=[0.3,0.7] fidelity.num_requests=12 \
fidelity.load_duration_s=0 fidelity.warmup_s=0 fidelity.real_repeats=1 fidelity.probe_requests=24}
  # measured 2026-11-27 on 2 shared cores: 2, 61, 24 and 109 s (the search stopped by its budget)
  budgets=(workload=30 profile=180 fidelity=120 capacity=180 real_bench=180 deep_profile=300)
else
  PRESET=${MODEL}_${HW} WORKLOAD=gpu_chat BACKEND=hf_cb_h100
  NUM_REQUESTS=${NUM_REQUESTS:-200}
  FIDELITY_ARGS=${FIDELITY_ARGS:-}
  # Qwen3-0.6B on an H100 (benchmarks/results/h100_qwen3_0_6b_20261126): a profile and
  # calibration took about 80 s, an engine start with CUDA graphs about 10 s, a load 30 s + that
  budgets=(workload=20 profile=200 fidelity=240 capacity=240 real_bench=150 deep_profile=150)
fi
QPS=${QPS:-4}
PROFILE_EXPERIMENT=${PROFILE_EXPERIMENT:-profile_$PRESET}
# empty FIDELITY_BACKEND: the preset's engine and knobs; a name (hf_generate, ...) replaces both
FIDELITY_BACKEND=${FIDELITY_BACKEND:-}
FIDELITY_EXPERIMENT=${FIDELITY_EXPERIMENT:-fidelity_$PRESET}
CAPACITY_EXPERIMENT=${CAPACITY_EXPERIMENT:-capacity_$PRESET}
CAPACITY_ARGS=${CAPACITY_ARGS:-}  # more overrides of the capacity stage's real phase
DP_ARGS=${DP_ARGS:-}  # more overrides of the deep profile, e.g. pipeline.ncu.enable=false
CAPACITY_SETUP_S=${CAPACITY_SETUP_S:-50}  # start, workload, bundle check and copy, manifest
CALL_LIMIT_S=${CALL_LIMIT_S:-570}  # one device command: 600 s, its set-up and tarballs included
WINDOW_S=${WINDOW_S:-720}  # the device time the plan may take (15 minutes, starts included)
want() { [[ " $STEPS " == *" $1 "* ]]; }
budget() {  # budget STEP: its seconds, BUDGET_<STEP>_S or the plan's default
  local var="BUDGET_${1^^}_S" pair
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  for pair in "${budgets[@]}"; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}" && return; done
  echo 0
}
for preset in "$PROFILE_EXPERIMENT" "$FIDELITY_EXPERIMENT" "$CAPACITY_EXPERIMENT"; do
  if [ ! -f "src/gpu_simulate_test/configs/experiment/$preset.yaml" ]; then
    echo "no preset $preset (src/gpu_simulate_test/configs/experiment/): MODEL=$MODEL HW=$HW" >&2
    exit 2
  fi
done
LOGS="$OUT/logs"
mkdir -p "$LOGS"

# the plan: each step's budget and their sum, before anything runs
plan=() total=0
for name in workload profile real_bench fidelity capacity nsys_probe deep_profile; do
  want "$name" || continue
  seconds=$(budget "$name")
  plan+=("$name ${seconds} s") total=$((total + seconds))
done
echo "plan ($MODEL on $HW, presets *_$PRESET): $(IFS=,; echo "${plan[*]}" | sed 's/,/, /g'); sum ${total} s" \
  | tee "$OUT/steps.txt"
if [ "$HW" = cpu ]; then
  echo "a dry run on CPU: no device window to fit" | tee -a "$OUT/steps.txt"
elif [ "$total" -gt "$WINDOW_S" ]; then
  echo "the plan's ${total} s are more than the window's ${WINDOW_S} s" | tee -a "$OUT/steps.txt"
fi
if [ "$HW" != cpu ] && [ "$total" -gt "$CALL_LIMIT_S" ]; then
  echo "more than one device command (${CALL_LIMIT_S} s): give each part its own call, e.g." \
    "STEPS=\"workload profile fidelity\" then STEPS=capacity" | tee -a "$OUT/steps.txt"
fi
[ -n "${PLAN_ONLY:-}" ] && exit 0  # the plan alone (tests/unit/config/test_gpu_presets.py reads it)

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
} > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

step() {  # step NAME CMD...: its budget printed, run under it, logged to logs/NAME.log, its wall
  # Ctrl-C at the budget (then a kill 30 s later), so a step that outlives it still leaves its
  # runs (marked interrupted) and its tarball is still made
  local name=$1; shift
  local seconds start=$SECONDS
  seconds=$(budget "$name")
  echo "---- $name: budget ${seconds} s"
  timeout -s INT -k 30 "$seconds" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - start)) budget_s=$seconds" | tee -a "$OUT/steps.txt"
  tail -12 "$LOGS/$name.log"
  return $rc
}

if want workload; then
  step workload python3 -m gpu_simulate_test.cli.workload model="$MODEL" workload="$WORKLOAD" \
    workload.num_requests="$NUM_REQUESTS" workload.qps="$QPS" output.run_id="$TAG-w" \
    progress=false
fi
if want profile; then
  # the bundle every later step reuses when it covers them (the presets share its ranges and
  # engine knobs: tests/unit/config/test_gpu_presets.py)
  step profile python3 -m gpu_simulate_test.cli.vidur_profile +experiment="$PROFILE_EXPERIMENT" \
    workload_dir="tmp/workload/$TAG-w" output.run_id="$TAG-p" progress=false
fi
if want real_bench; then
  step real_bench python3 -m gpu_simulate_test.cli.real_bench model="$MODEL" hardware="$HW" \
    backend="$BACKEND" workload_dir="tmp/workload/$TAG-w" output.run_id="$TAG-rb" progress=false
fi
if want workload || want profile || want real_bench; then
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
  # the run directory is self-contained (runs/, profiles/ with the reused bundle, the manifest):
  #   tar xzf fid.tgz -C tmp/fid_gpu && python -m gpu_simulate_test.cli.fidelity \
  #     fidelity.phase=sim fidelity.real_from=tmp/fid_gpu/fidelity/$TAG-fid
  set -f  # the overrides' [a,b] lists are Hydra's, not globs
  # shellcheck disable=SC2086
  step fidelity python3 -m gpu_simulate_test.cli.fidelity +experiment="$FIDELITY_EXPERIMENT" \
    ${FIDELITY_BACKEND:+backend="$FIDELITY_BACKEND"} fidelity.phase=real reuse_profile=true \
    output.root="$OUT/fid" output.run_id="$TAG-fid" progress=false $FIDELITY_ARGS
  set +f
  tar czf "$OUT/fid.tgz" -C "$OUT/fid" fidelity 2>/dev/null && rm -rf "$OUT/fid"
fi
if want capacity; then
  # the real search only, within what the step's budget leaves it; the run directory carries its
  # bundle and manifest; here:
  #   tar xzf capacity.tgz -C tmp/cap_gpu && python -m gpu_simulate_test.cli.capacity \
  #     +experiment=$CAPACITY_EXPERIMENT capacity.phase=sim \
  #     capacity.real_from=tmp/cap_gpu/capacity/$TAG-cap
  search_s=$(($(budget capacity) - CAPACITY_SETUP_S))
  [ "$search_s" -lt 1 ] && search_s=1
  set -f
  # shellcheck disable=SC2086
  step capacity python3 -m gpu_simulate_test.cli.capacity +experiment="$CAPACITY_EXPERIMENT" \
    capacity.phase=real capacity.verify_budget_s="$search_s" output.root="$OUT/cap" \
    output.run_id="$TAG-cap" progress=false $CAPACITY_ARGS
  set +f
  # the served model's weights and the engine's compile cache stay: the sim phase reads neither
  tar czf "$OUT/capacity.tgz" --exclude='*/runs/models' --exclude='*/runs/cache' \
    -C "$OUT/cap" capacity 2>/dev/null && rm -rf "$OUT/cap"
fi
echo "---- summary"
cat "$OUT/steps.txt"
# $OUT returns at most 8 files: the logs travel as one tarball
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
