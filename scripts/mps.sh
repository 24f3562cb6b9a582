#!/usr/bin/env bash
# Time-sharing one GPU between draft and target with CUDA MPS.
#
# Without MPS, two processes on one GPU take turns (time slicing): while the
# draft's kernels run, the target's wait, and the reverse. Under MPS their
# kernels run side by side, and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the
# share of the GPU's SMs a client process may use, so a busy draft cannot
# starve the target's verify pass. The limit is read when a process creates
# its CUDA context, so it is set per process, in its environment.
#
#   scripts/mps.sh start                 start the MPS control daemon (once per GPU host)
#   scripts/mps.sh status                daemon and MPS servers
#   scripts/mps.sh default PCT           default SM share for clients started from now on
#   scripts/mps.sh run PCT -- CMD ...    run CMD as an MPS client with PCT% of the SMs
#   scripts/mps.sh stop                  stop the daemon (stop the clients first)
#
# Per model instance (see docs/build.md): run each process that holds a model
# with its own share, e.g. a Triton server for the target with 70% and one for
# the draft with 30%:
#   scripts/mps.sh run 70 -- tritonserver --model-repository model_repo_target ...
#   scripts/mps.sh run 30 -- tritonserver --model-repository model_repo_draft ...
# Within one server, every model process it spawns inherits the server's share.
#
# Environment: CUDA_VISIBLE_DEVICES (the GPU(s) the daemon serves),
# CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and CUDA_MPS_LOG_DIRECTORY
# (default /tmp/nvidia-log); clients must see the same pipe directory.
set -euo pipefail

export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-log}"

die() { echo "mps.sh: $*" >&2; exit 1; }

need_control() {
    command -v nvidia-cuda-mps-control >/dev/null || die "nvidia-cuda-mps-control not found (it ships with the NVIDIA driver)"
}

check_pct() {
    [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 100 )) || die "percentage must be an integer in 1..100, got '$1'"
}

running() { [[ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ]] && pgrep -x nvidia-cuda-mps-control >/dev/null; }

cmd="${1:-}"
shift || true
case "$cmd" in
    start)
        need_control
        if running; then echo "MPS control daemon already running (pipe $CUDA_MPS_PIPE_DIRECTORY)"; exit 0; fi
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d
        echo "MPS control daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY, logs $CUDA_MPS_LOG_DIRECTORY)"
        ;;
    stop)
        need_control
        running || { echo "MPS control daemon not running"; exit 0; }
        echo quit | nvidia-cuda-mps-control
        echo "MPS control daemon stopped"
        ;;
    status)
        need_control
        if running; then
            echo "MPS control daemon running (pipe $CUDA_MPS_PIPE_DIRECTORY)"
            echo "servers: $(echo get_server_list | nvidia-cuda-mps-control | tr '\n' ' ')"
        else
            echo "MPS control daemon not running"
            exit 3
        fi
        ;;
    default)
        need_control
        [[ $# -eq 1 ]] || die "usage: mps.sh default PCT"
        check_pct "$1"
        running || die "start the daemon first: scripts/mps.sh start"
        echo "set_default_active_thread_percentage $1" | nvidia-cuda-mps-control
        ;;
    run)
        [[ $# -ge 3 && "$2" == "--" ]] || die "usage: mps.sh run PCT -- CMD [ARGS...]"
        check_pct "$1"
        pct="$1"
        shift 2
        running || die "start the daemon first: scripts/mps.sh start"
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$pct" exec "$@"
        ;;
    *)
        sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
        [[ -z "$cmd" || "$cmd" == -h || "$cmd" == --help ]] || exit 2
        ;;
esac
