#!/usr/bin/env bash
# Start the rljax launcher on every worker of a TPU VM, detached, with one gs:// workdir.
# Safe to rerun: a worker whose job is still running is left alone, and a relaunch with the same
# workdir resumes from its last checkpoint.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name config workdir bucket run-name)
BOOL_FLAGS=(dry-run)
ALLOW_CONFIG_OVERRIDES=1
ALLOW_ENV=1

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME --config=configs/NAME.py[:ARG]
         (--workdir=gs://BUCKET/PATH | --bucket=BUCKET) [--config.KEY=VALUE ...] [-- LAUNCHER ARGS]

Runs, on every worker at once (gcloud ... ssh --worker=all), from ~/rljax:
  nohup ~/rljax-venv/bin/rljax --config=... [--config.KEY=VALUE ...] --workdir=gs://...
with output appended to ~/rljax_logs/rljax.log and the pid in ~/rljax_logs/rljax.pid. On a pod
the launcher joins the hosts itself (jax.distributed.initialize). All workers must share the
workdir, hence gs://. Workers already running a job are skipped.

$(common_flags_help)
Flags:
  --config=PATH[:ARG]    experiment config, relative to the repo root     RLJAX_CONFIG
  --config.KEY=VALUE     override one config field; repeatable
  --workdir=gs://B/P     checkpoints, metrics and logs of this run          RLJAX_WORKDIR
  --bucket=BUCKET        with no --workdir: gs://BUCKET/rljax/RUN_NAME      RLJAX_BUCKET
  --run-name=NAME        run name for the default workdir (default: config file name, plus
                         its argument), so rerunning resumes the same run  RLJAX_RUN_NAME
  --env=KEY=VALUE        environment variable for the launcher; repeatable
  -- ARGS                passed to the launcher unchanged

Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e \\
    --config=configs/qwen2_5_1_5b_gsm8k.py:v6e8 --bucket=my-rljax-runs \\
    --config.init=gs://my-rljax-runs/models/Qwen2.5-1.5B-Instruct \\
    --config.data.path=gs://my-rljax-runs/data/gsm8k/train.jsonl --config.buffer.max_staleness=2
EOF
}

parse_flags "$@"
validate_common
require config configs/qwen2_5_1_5b_gsm8k.py:v6e8
[[ "${CONFIG}" =~ ^[A-Za-z0-9_./-]+\.py(:[^[:space:]\']*)?$ && "${CONFIG}" != /* ]] ||
  die "--config='${CONFIG}' must be a config file relative to the repo root, optionally with ':variant', e.g. --config=configs/arith_tiny.py:small"
if [[ -z "${RUN_NAME}" ]]; then
  RUN_NAME="$(basename "${CONFIG%%:*}" .py)"
  [[ "${CONFIG}" == *:* ]] && RUN_NAME+="-${CONFIG#*:}"
  RUN_NAME="$(printf '%s' "${RUN_NAME}" | tr -c 'A-Za-z0-9._-' '-')"
fi
[[ "${RUN_NAME}" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--run-name='${RUN_NAME}' may hold only letters, digits, '.', '_' and '-'"
if [[ -z "${WORKDIR}" ]]; then
  [[ -n "${BUCKET}" ]] ||
    die "missing --workdir=gs://BUCKET/PATH (or --bucket=BUCKET, RLJAX_BUCKET); every worker must write to the same place"
  validate_bucket
  WORKDIR="gs://${BUCKET}/rljax/${RUN_NAME}"
fi
[[ "${WORKDIR}" =~ ^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^[:space:]]*)?$ ]] ||
  die "--workdir='${WORKDIR}' must be a gs:// path, e.g. gs://my-rljax-runs/rljax/run1: a local path differs on each worker and dies with the VM"
WORKDIR="${WORKDIR%/}"
location_flags
require_tpu_vm

LAUNCH_ARGS=("--config=${CONFIG}" "${CONFIG_OVERRIDES[@]}" "--workdir=${WORKDIR}"
  "${PASSTHROUGH[@]}")
info "run ${RUN_NAME}: rljax $(shell_join "${LAUNCH_ARGS[@]}")"
ssh_all_workers launch_job.sh LAUNCH_ARGS ENV_ASSIGNMENTS
info "logs: scripts/gcp/status.sh --tpu-name=${TPU_NAME}; metrics under ${WORKDIR}"
