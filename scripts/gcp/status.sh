#!/usr/bin/env bash
# Report a TPU VM's state, whether rljax runs on each worker, and the tail of each worker's log;
# optionally the tail of the run's JSONL metrics in its gs:// workdir.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name lines workdir metrics-file)
BOOL_FLAGS=(follow dry-run)
LINES=20
METRICS_FILE=metrics.jsonl

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME [flags]

Prints the queued resource's state (if any), the TPU VM's state and health, then on every worker
whether rljax runs and the last lines of ~/rljax_logs/rljax.log. Exits 1 when the TPU VM is gone.

$(common_flags_help)
Flags:
  --lines=N              log and metrics lines to show (default 20)      RLJAX_LINES
  --follow               then follow worker 0's log (tail -F) until Ctrl-C RLJAX_FOLLOW=1
  --workdir=gs://B/P     also show the last metrics records of this run    RLJAX_WORKDIR
  --metrics-file=NAME    metrics file inside the workdir (default metrics.jsonl)

Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e \\
    --workdir=gs://my-rljax-runs/rljax/gsm8k_grpo
EOF
}

parse_flags "$@"
((${#PASSTHROUGH[@]} == 0)) || die "unexpected arguments after --: ${PASSTHROUGH[*]}"
validate_common
validate_positive_int lines
if [[ -n "${WORKDIR}" ]]; then
  [[ "${WORKDIR}" =~ ^gs://[^[:space:]]+$ ]] ||
    die "--workdir='${WORKDIR}' must be the run's gs:// workdir, as given to launch.sh"
  [[ "${METRICS_FILE}" =~ ^[A-Za-z0-9._/-]+$ ]] ||
    die "--metrics-file='${METRICS_FILE}' must be a path inside the workdir, e.g. metrics.jsonl"
fi
location_flags

if DRY_RUN_EXISTS=0 describe_resource queued-resources "${TPU_NAME}"; then
  echo "queued resource ${TPU_NAME}: ${RESOURCE_STATE:-unknown}"
fi
DRY_RUN_EXISTS=1
if ! describe_resource tpu-vm "${TPU_NAME}"; then
  echo "TPU VM ${TPU_NAME}: not found in ${PROJECT}/${ZONE}"
  exit 1
fi
if [[ -z "${DRY_RUN}" ]]; then
  health="$(gcloud compute tpus tpu-vm describe "${TPU_NAME}" "${LOCATION[@]}" \
    --format='value(health)' 2>/dev/null || true)"
  echo "TPU VM ${TPU_NAME}: ${RESOURCE_STATE:-unknown}${health:+ (health ${health})}"
  if [[ "${RESOURCE_STATE}" != READY ]]; then
    info "workers are not reachable while the TPU VM is ${RESOURCE_STATE}"
    exit 0
  fi
fi

ssh_all_workers job_status.sh LINES
if [[ -n "${WORKDIR}" ]]; then
  metrics="${WORKDIR%/}/${METRICS_FILE}"
  echo "--- last ${LINES} records of ${metrics}"
  if [[ -n "${DRY_RUN}" ]]; then
    run_cmd gcloud storage cat "${metrics}"
  else
    # gcloud storage cat streams the whole object; fine for JSONL metrics of one run.
    gcloud storage cat "${metrics}" | tail -n "${LINES}" ||
      info "could not read ${metrics}; metrics appear after the first logged step"
  fi
fi
if [[ -n "${FOLLOW}" ]]; then
  run_cmd gcloud compute tpus tpu-vm ssh "${TPU_NAME}" "${LOCATION[@]}" --worker=0 \
    --command='tail -n 0 -F ~/rljax_logs/rljax.log'
fi
