#!/usr/bin/env bash
# Install rljax on every worker of a TPU VM: a Python venv with jax[tpu] and `pip install -e`
# of the repo, shipped from this checkout or cloned from git. Safe to rerun.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VALUE_FLAGS=(project zone tpu-name repo-url git-ref python-version extra-pip)
BOOL_FLAGS=(dry-run)
GIT_REF=main
PYTHON_VERSION=3.11

usage() {
  cat <<EOF
Usage: ${SCRIPT_NAME} --project=ID --zone=ZONE --tpu-name=NAME [flags]

On every worker (gcloud ... ssh --worker=all): puts the rljax source in ~/rljax, makes the venv
~/rljax-venv with Python 3.11 (through uv, since TPU images ship an older Python), and runs
'pip install -e ~/rljax jax[tpu]'. Without --repo-url it ships the committed HEAD of this
checkout (git archive + scp; uncommitted edits are not sent). It refuses to touch a worker
whose rljax job is still running: stop it first with stop.sh.

$(common_flags_help)
Flags:
  --repo-url=URL         git URL to fetch instead of shipping this checkout RLJAX_REPO_URL
  --git-ref=REF          branch, tag or commit for --repo-url (default main) RLJAX_GIT_REF
  --python-version=X.Y   Python for the venv (default 3.11)              RLJAX_PYTHON_VERSION
  --extra-pip=PKGS       extra pip requirements, space-separated         RLJAX_EXTRA_PIP

Example:
  ${SCRIPT_NAME} --project=my-project --zone=us-east5-b --tpu-name=rljax-v6e
EOF
}

parse_flags "$@"
((${#PASSTHROUGH[@]} == 0)) || die "unexpected arguments after --: ${PASSTHROUGH[*]}"
validate_common
[[ "${PYTHON_VERSION}" =~ ^3\.[0-9]+$ ]] ||
  die "--python-version='${PYTHON_VERSION}' must look like 3.11 (rljax needs Python >= 3.11)"
if [[ -n "${REPO_URL}" ]]; then
  [[ "${REPO_URL}" =~ ^(https://|git@|ssh://|file://|/) ]] ||
    die "--repo-url='${REPO_URL}' is not a git URL; use https://..., git@host:org/repo.git or ssh://..."
  [[ "${GIT_REF}" =~ ^[A-Za-z0-9._/-]+$ ]] ||
    die "--git-ref='${GIT_REF}' is not a branch, tag or commit name"
fi
location_flags
require_tpu_vm

TARBALL_NAME=""
if [[ -z "${REPO_URL}" ]]; then
  git -C "${REPO_ROOT}" rev-parse --verify -q HEAD >/dev/null ||
    die "${REPO_ROOT} has no commit to ship; commit first or pass --repo-url"
  if [[ -n "$(git -C "${REPO_ROOT}" status --porcelain --untracked-files=no)" ]]; then
    info "warning: uncommitted changes in ${REPO_ROOT} are not shipped; only HEAD is"
  fi
  TARBALL_NAME="rljax-src.tar.gz"
  tmp_dir="$(mktemp -d)"
  trap 'rm -rf "${tmp_dir}"' EXIT
  run_cmd git -C "${REPO_ROOT}" archive --format=tar.gz -o "${tmp_dir}/${TARBALL_NAME}" HEAD
  # A remote path without a leading / or ~ is relative to the worker's home directory.
  run_cmd gcloud compute tpus tpu-vm scp "${tmp_dir}/${TARBALL_NAME}" \
    "${TPU_NAME}:${TARBALL_NAME}" "${LOCATION[@]}" --worker=all
fi

ssh_all_workers setup_worker.sh REPO_URL GIT_REF TARBALL_NAME PYTHON_VERSION EXTRA_PIP
