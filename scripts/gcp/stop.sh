#!/usr/bin/env bash
# Stop the rljax job on every worker with SIGTERM, which makes the launcher save a checkpoint
# and exit 0. The TPU VM keeps running; delete.sh removes it. A no-op where nothing runs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name grace-seconds)
BOOL_FLAGS=(force dry-run)
# Read by name when ssh_all_workers ships it to the workers.
# shellcheck disable=SC2034
GRACE_SECONDS=600

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME [flags]

Sends SIGTERM to the rljax launcher on every worker (pid from ~/rljax_logs/rljax.pid) and waits
for it to checkpoint and exit. Relaunching with the same workdir resumes the run. If the TPU VM
is already gone there is nothing to stop, and the script says so and exits 0.

$(common_flags_help)
Flags:
  --grace-seconds=N      how long to wait for the checkpoint (default 600) RLJAX_GRACE_SECONDS
  --force                SIGKILL a job still running after the grace period  RLJAX_FORCE=1

Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e
EOF
}

parse_flags "$@"
((${#PASSTHROUGH[@]} == 0)) || die "unexpected arguments after --: ${PASSTHROUGH[*]}"
validate_common
validate_positive_int grace-seconds
location_flags

if ! DRY_RUN_EXISTS=1 describe_resource tpu-vm "${TPU_NAME}"; then
  info "TPU VM '${TPU_NAME}' not found in ${PROJECT}/${ZONE}; no job to stop"
  exit 0
fi
if [[ -n "${RESOURCE_STATE}" && "${RESOURCE_STATE}" != READY ]]; then
  info "TPU VM '${TPU_NAME}' is ${RESOURCE_STATE}; its workers cannot be reached, so no job to stop"
  exit 0
fi
ssh_all_workers stop_job.sh GRACE_SECONDS FORCE
