#!/usr/bin/env bash
# Delete a TPU VM and the queued resource that made it, if any. A no-op when both are gone.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name)
BOOL_FLAGS=(dry-run)

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME [--dry-run]

Deletes the queued resource NAME (with --force, which also deletes its TPU VM) if there is one,
otherwise the TPU VM NAME. Nothing is asked interactively. Checkpoints in the gs:// workdir are
kept; run stop.sh first so the job writes a last one.

$(common_flags_help)
Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e
EOF
}

parse_flags "$@"
((${#PASSTHROUGH[@]} == 0)) || die "unexpected arguments after --: ${PASSTHROUGH[*]}"
validate_common
location_flags
DRY_RUN_EXISTS=1

deleted=""
if describe_resource queued-resources "${TPU_NAME}"; then
  run_cmd gcloud compute tpus queued-resources delete "${TPU_NAME}" "${LOCATION[@]}" --force \
    --quiet
  deleted=1
fi
# Under --dry-run only the queued-resource branch is printed: --force already covers the VM.
if [[ -z "${deleted}" ]] && describe_resource tpu-vm "${TPU_NAME}"; then
  run_cmd gcloud compute tpus tpu-vm delete "${TPU_NAME}" "${LOCATION[@]}" --quiet
  deleted=1
fi
if [[ -z "${deleted}" ]]; then
  info "no TPU VM or queued resource named '${TPU_NAME}' in ${PROJECT}/${ZONE}; nothing to delete"
fi
