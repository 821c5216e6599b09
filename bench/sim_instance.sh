# Sourced by the bench scripts that simulate a live `strata serve` (bash).
# sim_instance_yaml DEVICE_BYTES COSTS: prints a cluster file's `instance:`
# block shaped as one `strata serve` with its defaults (64 sequences, 512
# tokens per step, 16-token f16 blocks), a DEVICE_BYTES device pool, no
# lower tiers, and the step costs in the calibration file COSTS (relative
# to the cluster file).
sim_instance_yaml() {
  cat <<YAML
instance:
  profile: cpu-bench-110m
  model: bench-110m
  kv_dtype: f16
  block_size: 16
  device_bytes: $1
  host_bytes: 0
  disk_bytes: 0
  max_num_seqs: 64
  max_batch_tokens: 512
  cost:
    calibrated: $2
YAML
}
