#!/usr/bin/env bash
# Create a Cloud TPU VM for rljax, directly or through a queued resource. Safe to rerun: an
# existing TPU VM or queued resource of the same name is left alone.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name accelerator-type runtime-version wait-timeout poll-seconds
  service-account)
BOOL_FLAGS=(queued spot dry-run)
WAIT_TIMEOUT=3600
POLL_SECONDS=30

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME --accelerator-type=TYPE [flags]

Creates the TPU VM NAME. With --queued it files a queued resource (also named NAME, whose node
is NAME) and waits until it is ACTIVE, which is how large or spot slices are usually obtained.
If the TPU VM or the queued resource already exists, nothing is created.

$(common_flags_help)
Flags:
  --accelerator-type=TYPE  v5litepod-8, v6e-8, v5p-32, v4-8, ...    RLJAX_ACCELERATOR_TYPE
  --runtime-version=V      TPU software image; default by generation: v5litepod
                           v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e,
                           others tpu-ubuntu2204-base                 RLJAX_RUNTIME_VERSION
  --spot                   spot capacity: cheaper, preemptible; rljax checkpoints on SIGTERM
                           and resumes from the same workdir          RLJAX_SPOT=1
  --queued                 create through a queued resource           RLJAX_QUEUED=1
  --service-account=EMAIL  service account for the VM (needs storage access to the bucket)
  --wait-timeout=SECONDS   how long --queued waits for ACTIVE (default 3600; 0: do not wait)
  --poll-seconds=SECONDS   queued-resource polling interval (default 30)

Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e \\
    --accelerator-type=v6e-8 --queued --spot
EOF
}

parse_flags "$@"
((${#PASSTHROUGH[@]} == 0)) || die "unexpected arguments after --: ${PASSTHROUGH[*]}"
validate_common
validate_accelerator_type
validate_positive_int wait-timeout
validate_positive_int poll-seconds
[[ -z "${SERVICE_ACCOUNT}" || "${SERVICE_ACCOUNT}" =~ ^[a-z0-9-]+@[a-z0-9.-]+\.gserviceaccount\.com$ ]] ||
  die "--service-account='${SERVICE_ACCOUNT}' is not a service account email, e.g. rljax-tpu@my-project.iam.gserviceaccount.com"
RUNTIME_VERSION="${RUNTIME_VERSION:-$(default_runtime_version)}"
[[ "${RUNTIME_VERSION}" =~ ^[a-z0-9.-]+$ ]] ||
  die "--runtime-version='${RUNTIME_VERSION}' is not a runtime name, e.g. v2-alpha-tpuv6e"
location_flags

# Wait until the queued resource is ACTIVE; its node is then an ordinary TPU VM.
wait_until_active() {
  local state deadline=$((SECONDS + WAIT_TIMEOUT))
  while true; do
    describe_resource queued-resources "${TPU_NAME}" ||
      die "queued resource '${TPU_NAME}' disappeared while waiting; rerun ${SCRIPT_NAME}"
    state="${RESOURCE_STATE}"
    case "${state}" in
      ACTIVE)
        info "queued resource '${TPU_NAME}' is ACTIVE; TPU VM '${TPU_NAME}' is ready"
        return 0
        ;;
      FAILED | SUSPENDED | SUSPENDING | DELETING)
        die "queued resource '${TPU_NAME}' is ${state}; inspect it with 'gcloud compute tpus queued-resources describe ${TPU_NAME} --zone=${ZONE}', then delete.sh and retry (another zone or --spot may have capacity)"
        ;;
    esac
    if ((SECONDS >= deadline)); then
      die "queued resource '${TPU_NAME}' still ${state:-pending} after ${WAIT_TIMEOUT}s; it stays queued, so rerun ${SCRIPT_NAME} later to keep waiting, or delete.sh to give up"
    fi
    info "queued resource '${TPU_NAME}' is ${state:-pending}; checking again in ${POLL_SECONDS}s"
    sleep "${POLL_SECONDS}"
  done
}

if describe_resource tpu-vm "${TPU_NAME}"; then
  info "TPU VM '${TPU_NAME}' already exists (state ${RESOURCE_STATE:-unknown}); not creating it"
  exit 0
fi

spot_flags=()
[[ -n "${SPOT}" ]] && spot_flags=(--spot)
account_flags=()
# The full cloud-platform scope leaves access control to the account's IAM roles, so a bucket
# grant is all the job needs for gs:// workdirs.
[[ -n "${SERVICE_ACCOUNT}" ]] && account_flags=(--service-account="${SERVICE_ACCOUNT}"
  --scopes=https://www.googleapis.com/auth/cloud-platform)

if [[ -n "${QUEUED}" ]]; then
  if describe_resource queued-resources "${TPU_NAME}"; then
    info "queued resource '${TPU_NAME}' already exists; not filing another"
  else
    run_cmd gcloud compute tpus queued-resources create "${TPU_NAME}" "${LOCATION[@]}" \
      --node-id="${TPU_NAME}" --accelerator-type="${ACCELERATOR_TYPE}" \
      --runtime-version="${RUNTIME_VERSION}" "${spot_flags[@]}" "${account_flags[@]}"
  fi
  if [[ -z "${DRY_RUN}" ]] && ((WAIT_TIMEOUT > 0)); then
    wait_until_active
  fi
else
  run_cmd gcloud compute tpus tpu-vm create "${TPU_NAME}" "${LOCATION[@]}" \
    --accelerator-type="${ACCELERATOR_TYPE}" --version="${RUNTIME_VERSION}" \
    "${spot_flags[@]}" "${account_flags[@]}"
fi
