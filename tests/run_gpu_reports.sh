#!/usr/bin/env bash
# Every GPU check, report and benchmark of this project on this machine, each step's output kept:
#
#   bash tests/run_gpu_reports.sh OUT [STEP ...]
#
# OUT gets one folder per machine and day, gpu-<gpu>-<yyyymmdd>/, holding <step>.txt for each step
# (stdout and stderr, unbuffered, as it ran; a step run again that day replaces its file) and
# steps.txt (each step's UTC start, exit code and seconds, appended). A step that fails or passes
# its time limit does not stop the next; Ctrl-C or a TERM stops the step and the run. STEPs
# (default: all, in this order): machine profile memory suite scan scan_model validate whatif
# gpu_compute scaled_timing scan_time. `profile` is the full device profile, `topoprof profile`'s
# JSON as shipped in topoprof/model/compute/profiles/; `memory` a step's memory and time beside the
# prediction (tests/benchmarks/bench_gpu_memory.py), priced from that profile where it ran first.
set -u
[ $# -ge 1 ] || { echo "usage: bash tests/run_gpu_reports.sh OUT [STEP ...]" >&2; exit 2; }
base=$(realpath -m "$1")  # before the cd below: a relative OUT is the caller's
shift
cd "$(dirname "$0")/.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
out="$base/gpu-${gpu:-none}-$(date -u +%Y%m%d)"
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 start rc
    shift 2
    echo "== $name: $*"
    start=$(date +%s)
    # timeout runs in a process group of its own, which a terminal's Ctrl-C does not reach: the
    # trap passes INT and TERM on to that group and ends the run
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.txt" 2>&1 &
    pid=$!
    trap 'kill -TERM -- -$pid 2>/dev/null; wait $pid; echo "$name stopped" | tee -a "$out/steps.txt"; exit 130' INT TERM
    wait $pid
    rc=$?
    trap - INT TERM
    echo "$(date -u -d @"$start" +%H:%M:%SZ) $name exit $rc, $(( $(date +%s) - start )) s (limit $limit s): $*" \
        | tee -a "$out/steps.txt"
}

run() {
    case $1 in
        machine) step machine 30 sh -c 'nvidia-smi; nvidia-smi topo -m | cat -v; nproc; free -g; python -c "import \
                     torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), \
                     torch.cuda.get_device_name(0))"; git log -1 --format=%H' ;;
        profile) step profile 150 python -m topoprof profile --device cuda --out "$out/profile.json" ;;
        memory) step memory 330 python tests/benchmarks/bench_gpu_memory.py --out "$out/memory.json" \
                    $( [ -f "$out/profile.json" ] && echo --gpu-profile "$out/profile.json" ) ;;
        suite) step suite 560 python tests/run_gpu_suite.py --out "$out/suite" ;;
        scan) step scan 180 python -m topoprof scan --out "$out/scan" ;;
        scan_model) step scan_model 180 python -m topoprof scan --model tests/fixtures/user_models/tied.py:build_1m \
                        --out "$out/scan-model" ;;
        validate) step validate 180 python -m topoprof validate --backend nccl --save-calibration "$out/calibration.json" ;;
        whatif) step whatif 180 python tests/benchmarks/bench_whatif_compute.py --device cuda ;;
        gpu_compute) step gpu_compute 200 python tests/benchmarks/bench_gpu_compute.py --budget 150 ;;
        scaled_timing) step scaled_timing 300 python tests/benchmarks/bench_scaled_timing.py ;;
        scan_time) step scan_time 360 python tests/benchmarks/bench_scan_time.py ;;
    esac
}

all=(machine profile memory suite scan scan_model validate whatif gpu_compute scaled_timing scan_time)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${all[@]}")
for s in "${steps[@]}"; do  # every name checked before anything runs
    [[ " ${all[*]} " == *" $s "* ]] || { echo "unknown step: $s (steps: ${all[*]})" >&2; exit 2; }
done
mkdir -p "$out"
for s in "${steps[@]}"; do
    run "$s"
done
echo "outputs: $out"
