# Sourced (scripts/gpu-test, scripts/device-check): starts and stops the CUDA MPS daemon around suites
# whose processes share one GPU, so that their kernels run concurrently instead of time-sliced.
#   mps_start   starts it in a fresh folder; if it cannot start, or a probe client cannot connect
#               ($mps_probe_exe --probe, when set), it leaves MPS off and the processes run time-sliced
#   mps_stop    stops it (if this script started it) and waits for the server to leave
# Uses the caller's note() for messages when there is one.
declare -F note >/dev/null || note() { echo "mps: $*"; }
mps_on=0
mps_probe_exe=${mps_probe_exe:-}
mps_start() {
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    note "MPS: nvidia-cuda-mps-control not found; the processes run time-sliced"
    return
  fi
  local dir
  dir=$(mktemp -d /tmp/comet-mps.XXXXXX)
  mkdir -p "$dir/pipe" "$dir/log"
  export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
  if ! nvidia-cuda-mps-control -d; then
    note "MPS: the control daemon did not start; the processes run time-sliced"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return
  fi
  mps_on=1
  # A client is where a broken MPS server shows: create one context through it.
  if [ -n "$mps_probe_exe" ] && ! timeout 60 "$mps_probe_exe" --probe; then
    note "MPS: started, but a CUDA client could not connect (see $dir/log); stopping it, the processes run time-sliced"
    mps_stop
    return
  fi
  note "MPS: running (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
}
mps_stop() {
  [ "$mps_on" -eq 1 ] || return 0
  echo quit | timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1 || true
  # The server leaves once its clients are gone; give it a moment before non-MPS processes start.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || break
    sleep 0.5
  done
  sleep 1
  mps_on=0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  note "MPS: stopped"
}
