# Sourced by the device scripts (device-check, device-next, device-goals) on the lent machine: the CUDA
# and NVSHMEM libraries, NVSHMEM's settings for several PEs on one GPU, and the shipped tune table. Needs
# $root; sets $nv (NVSHMEM's lib folder: torch's nvidia-nvshmem-cu13 wheel there, the version comet builds
# against; its bootstrap plugin is carried in case the wheel lacks it).
nv=$(python3 -c 'import nvidia.nvshmem as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
[ -f "$nv/nvshmem_bootstrap_uid.so.3" ] || export NVSHMEM_BOOTSTRAP_PLUGIN=$root/.carry/nvshmem/nvshmem_bootstrap_uid.so.3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$nv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export COMET_NVSHMEM_LIB=$nv/libnvshmem_host.so.3
# NVLink multicast stays off on those machines (KINDS.md); NCCL refuses several PEs on one GPU.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NCCL=1
export COMET_TUNE_TABLE=$root/bench/results/h200_tune_table.json

# comet's tuned run against the sequential baseline, paired (the scripts' check step):
#   paired_run NAME LAYERS [comet-bench args: the cases, --commit, ...]
# writes NAME.json and NAME.log, then prints the exit status and the ratios (bench/paired_ratios.py).
# A table other than the shipped one: COMET_TUNE_TABLE=FILE paired_run ...; a time limit in seconds:
# LIMIT=S paired_run ... (what ran by then is in NAME.json: comet-bench writes it after each case).
# Needs $t0 (the call's start).
paired_run() {
  local name=$1 layers=$2; shift 2
  timeout "${LIMIT:-0}" "$root/.carry/bench/comet-bench" --systems comet,sequential --n-comm 0 --tuned-tile \
    --layers "$layers" --paired "$@" --out "$name.json" > "$name.log" 2>&1
  local rc=$?  # before the echo's own command substitutions reset $?
  echo "== $(basename "$name") exit $rc at $(( $(date +%s) - t0 )) s"
  python3 "$root/bench/paired_ratios.py" "$name.json" --list --layers "$layers"
}

# The whole comet_gpu_tests in SHARDS parallel shards (default 3) beside comet-fuzz (the scripts' GPU-suite
# step; more shards finish sooner, but beside 5 others two memory-hungry suites have run out of memory):
#   gpu_suite_shards BIN OUT LIMIT SEED   (BIN holds comet_gpu_tests and comet-fuzz; FUZZ batches, default 800)
# writes OUT/shard<i>.txt and OUT/fuzz.txt, prints their summaries; non-zero if any of them failed.
gpu_suite_shards() {
  local bin=$1 out=$2 lim=$3 seed=$4 n=${SHARDS:-3} t rc=0 i job
  t=$(date +%s)
  for (( i = 0; i < n; i++ )); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "$lim" "$bin/comet_gpu_tests" --gtest_brief=1 > "$out/shard$i.txt" 2>&1 &
  done
  timeout $(( lim - 10 )) "$bin/comet-fuzz" --batches "${FUZZ:-800}" --jobs 2 --seed "$seed" > "$out/fuzz.txt" 2>&1 &
  for job in $(jobs -p); do wait "$job" || rc=1; done
  echo "== gtest shards + fuzz $(( $(date +%s) - t )) s (limit $lim)"
  for (( i = 0; i < n; i++ )); do grep -E '^\[  (PASSED|FAILED) |tests? from .* ran' "$out/shard$i.txt"; done
  tail -4 "$out/fuzz.txt"
  return $rc
}
