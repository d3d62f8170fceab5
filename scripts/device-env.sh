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
# A table other than the shipped one: COMET_TUNE_TABLE=FILE paired_run ...  Needs $t0 (the call's start).
paired_run() {
  local name=$1 layers=$2; shift 2
  "$root/.carry/bench/comet-bench" --systems comet,sequential --n-comm 0 --tuned-tile --layers "$layers" --paired "$@" \
    --out "$name.json" > "$name.log" 2>&1
  echo "== $(basename "$name") exit $? at $(( $(date +%s) - t0 )) s"
  python3 "$root/bench/paired_ratios.py" "$name.json" --list --layers "$layers"
}
