# shellcheck shell=bash
# Variables set here are read by the scripts that source this file, hence SC2034.
# shellcheck disable=SC2034
# Shared helpers for the rljax TPU VM scripts in scripts/gcp/. Sourced, never executed.
#
# Every script declares the flags it accepts in VALUE_FLAGS and BOOL_FLAGS, then calls
# parse_flags "$@". A flag --some-name fills the variable SOME_NAME; its default comes from the
# environment variable RLJAX_SOME_NAME, so `export RLJAX_ZONE=us-east5-b` once and every script
# picks it up. Flags win over the environment.

GCP_SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${GCP_SCRIPT_DIR}/../.." && pwd)"
SCRIPT_NAME="$(basename "$0")"

die() {
  echo "${SCRIPT_NAME}: error: $*" >&2
  exit 2
}

info() {
  echo "${SCRIPT_NAME}: $*" >&2
}

# Quote one word for a shell the way a person would type it: bare when that is safe, otherwise
# in single quotes. Dry-run output can then be pasted back into a terminal.
shell_quote() {
  local word="$1"
  if [[ "${word}" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "${word}"
  else
    printf "'%s'" "${word//\'/\'\\\'\'}"
  fi
}

shell_join() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(shell_quote "${word}")"
  done
  printf '%s' "${out}"
}

contains() {
  local needle="$1" item
  shift
  for item in "$@"; do
    [[ "${item}" == "${needle}" ]] && return 0
  done
  return 1
}

flag_var() {
  local name="${1//-/_}"
  printf '%s' "${name^^}"
}

# Fill every declared flag's variable from RLJAX_<VAR>, then from the command line. Arguments
# after a bare `--` are kept in PASSTHROUGH; --config.<key>=<value> goes to CONFIG_OVERRIDES
# when the script sets ALLOW_CONFIG_OVERRIDES=1; --env=KEY=VALUE goes to ENV_ASSIGNMENTS.
parse_flags() {
  local name var env_name arg value has_value
  PASSTHROUGH=()
  CONFIG_OVERRIDES=()
  ENV_ASSIGNMENTS=()
  for name in "${VALUE_FLAGS[@]}" "${BOOL_FLAGS[@]}"; do
    var="$(flag_var "${name}")"
    env_name="RLJAX_${var}"
    if [[ -n "${!env_name:-}" ]]; then
      printf -v "${var}" '%s' "${!env_name}"
    elif [[ -z "${!var:-}" ]]; then
      printf -v "${var}" '%s' ""
    fi
  done
  # gcloud itself honours CLOUDSDK_CORE_PROJECT, so accept it as the project too.
  if contains project "${VALUE_FLAGS[@]}" && [[ -z "${PROJECT}" ]]; then
    PROJECT="${CLOUDSDK_CORE_PROJECT:-}"
  fi
  while (($# > 0)); do
    arg="$1"
    shift
    case "${arg}" in
      -h | --help)
        usage
        exit 0
        ;;
      --)
        PASSTHROUGH=("$@")
        break
        ;;
      --*=*)
        name="${arg%%=*}"
        name="${name#--}"
        value="${arg#*=}"
        has_value=1
        ;;
      --*)
        name="${arg#--}"
        value=""
        has_value=0
        ;;
      *) die "unexpected argument '${arg}'; flags look like --name=value (see --help)" ;;
    esac
    if [[ "${name}" == config.* && "${ALLOW_CONFIG_OVERRIDES:-0}" == 1 ]]; then
      ((has_value)) || die "--${name} needs a value: --${name}=<value>"
      CONFIG_OVERRIDES+=("--${name}=${value}")
    elif [[ "${name}" == env && "${ALLOW_ENV:-0}" == 1 ]]; then
      if ((!has_value)); then
        (($# > 0)) || die "--env needs KEY=VALUE, e.g. --env=LIBTPU_INIT_ARGS=--xla_foo"
        value="$1"
        shift
      fi
      [[ "${value}" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
        die "--env='${value}' is not KEY=VALUE; write e.g. --env=XLA_FLAGS=--xla_dump_to=/tmp/x"
      ENV_ASSIGNMENTS+=("${value}")
    elif contains "${name}" "${BOOL_FLAGS[@]}"; then
      ((has_value)) && die "--${name} is a switch and takes no value; write just --${name}"
      printf -v "$(flag_var "${name}")" '%s' 1
    elif [[ "${name}" == no-* ]] && contains "${name#no-}" "${BOOL_FLAGS[@]}"; then
      printf -v "$(flag_var "${name#no-}")" '%s' ""
    elif contains "${name}" "${VALUE_FLAGS[@]}"; then
      if ((!has_value)); then
        (($# > 0)) || die "--${name} needs a value: --${name}=<value>"
        value="$1"
        shift
      fi
      printf -v "$(flag_var "${name}")" '%s' "${value}"
    else
      die "unknown flag --${name}; ${SCRIPT_NAME} --help lists its flags"
    fi
  done
  # Booleans: any non-empty value other than 0/false counts as set.
  for name in "${BOOL_FLAGS[@]}"; do
    var="$(flag_var "${name}")"
    case "${!var,,}" in
      "" | 0 | false | no) printf -v "${var}" '%s' "" ;;
      *) printf -v "${var}" '%s' 1 ;;
    esac
  done
}

# Help text for the flags every script shares; scripts print it from usage().
common_flags_help() {
  cat <<'EOF'
Common flags (each also read from the environment variable shown):
  --project=ID           GCP project id                  RLJAX_PROJECT (or CLOUDSDK_CORE_PROJECT)
  --zone=ZONE            TPU zone, e.g. us-east5-b       RLJAX_ZONE
  --tpu-name=NAME        TPU VM (node) name              RLJAX_TPU_NAME
  --dry-run              print every gcloud command (describes included) instead of running it;
                         the printed plan assumes each action is needed     RLJAX_DRY_RUN=1
  -h, --help             this text
EOF
}

require() {
  local name="$1" example="$2" var
  var="$(flag_var "${name}")"
  [[ -n "${!var}" ]] || die "missing --${name} (or RLJAX_${var}); e.g. --${name}=${example}"
}

validate_common() {
  require project my-project
  require zone us-east5-b
  require tpu-name rljax-v6e-8
  [[ "${PROJECT}" =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ || "${PROJECT}" =~ ^[a-z0-9.-]+:[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] ||
    die "--project='${PROJECT}' is not a GCP project id (6-30 chars: lowercase letters, digits, hyphens; starts with a letter)"
  [[ "${ZONE}" =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] ||
    die "--zone='${ZONE}' is not a zone name; zones look like us-east5-b or europe-west4-a"
  [[ "${TPU_NAME}" =~ ^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$ ]] ||
    die "--tpu-name='${TPU_NAME}' is not a valid TPU name (lowercase letters, digits, hyphens; starts with a letter; at most 63 chars)"
}

validate_accelerator_type() {
  require accelerator-type v6e-8
  if [[ "${ACCELERATOR_TYPE}" =~ ^v5e-([0-9]+)$ ]]; then
    die "--accelerator-type='${ACCELERATOR_TYPE}': Cloud TPU calls v5e 'v5litepod'; use --accelerator-type=v5litepod-${BASH_REMATCH[1]}"
  fi
  [[ "${ACCELERATOR_TYPE}" =~ ^(v2|v3|v4|v5litepod|v5p|v6e)-[0-9]+$ ]] ||
    die "--accelerator-type='${ACCELERATOR_TYPE}' is not a TPU type; use <generation>-<chips or cores>, e.g. v5litepod-8, v6e-8, v5p-32, v4-8"
}

# The TPU software image for each generation, from the Cloud TPU docs' runtime table.
default_runtime_version() {
  case "${ACCELERATOR_TYPE%%-*}" in
    v5litepod) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
    *) echo tpu-ubuntu2204-base ;;
  esac
}

validate_bucket() {
  BUCKET="${BUCKET#gs://}"
  BUCKET="${BUCKET%/}"
  [[ "${BUCKET}" =~ ^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$ ]] ||
    die "--bucket='${BUCKET}' is not a bucket name (3-63 chars: lowercase letters, digits, '-', '_', '.'), e.g. --bucket=my-rljax-runs"
}

validate_positive_int() {
  local name="$1" var
  var="$(flag_var "${name}")"
  [[ "${!var}" =~ ^[0-9]+$ ]] || die "--${name}='${!var}' must be a whole number of seconds or lines"
}

# The flags that place every gcloud tpus call; zone and project are always explicit so a stray
# `gcloud config set` cannot send a command to the wrong project.
location_flags() {
  LOCATION=(--project="${PROJECT}" --zone="${ZONE}")
}

# Run a command that changes something, or print it under --dry-run.
run_cmd() {
  if [[ -n "${DRY_RUN}" ]]; then
    echo "[dry-run] $(shell_join "$@")"
    return 0
  fi
  info "+ $(shell_join "$@")"
  "$@"
}

# describe_resource KIND NAME: return 0 and set RESOURCE_STATE when the resource exists, return
# 1 when gcloud says NOT_FOUND, and stop on any other failure (auth, quota, API disabled) so a
# broken credential never reads as "already gone". KIND is tpu-vm or queued-resources. Call it
# directly, not in $(...), so that stopping stops the script. Under --dry-run the describe is
# printed and DRY_RUN_EXISTS (0 or 1) decides the answer.
describe_resource() {
  local kind="$1" name="$2" fmt out rc
  RESOURCE_STATE=""
  if [[ "${kind}" == queued-resources ]]; then fmt='value(state.state)'; else fmt='value(state)'; fi
  local cmd=(gcloud compute tpus "${kind}" describe "${name}" "${LOCATION[@]}" --format="${fmt}")
  if [[ -n "${DRY_RUN}" ]]; then
    echo "[dry-run] $(shell_join "${cmd[@]}")"
    [[ "${DRY_RUN_EXISTS:-0}" == 1 ]] && return 0
    return 1
  fi
  rc=0
  out="$("${cmd[@]}" 2>&1)" || rc=$?
  if ((rc == 0)); then
    RESOURCE_STATE="${out//[[:space:]]/}"
    return 0
  fi
  if [[ "${out,,}" == *not_found* || "${out,,}" == *"not found"* ]]; then
    return 1
  fi
  echo "${out}" >&2
  die "'gcloud compute tpus ${kind} describe ${name}' failed (exit ${rc}); check 'gcloud auth login', the project and that the TPU API is enabled (docs/tpu.md)"
}

# Require the TPU VM to exist before talking to its workers.
require_tpu_vm() {
  if ! DRY_RUN_EXISTS=1 describe_resource tpu-vm "${TPU_NAME}"; then
    die "TPU VM '${TPU_NAME}' not found in ${PROJECT}/${ZONE}; create it first with scripts/gcp/create.sh"
  fi
  if [[ -n "${RESOURCE_STATE}" && "${RESOURCE_STATE}" != READY ]]; then
    die "TPU VM '${TPU_NAME}' is ${RESOURCE_STATE}, not READY; wait, or delete.sh and create.sh again if it was preempted"
  fi
}

# Prefix a remote script with its inputs as shell assignments, quoted for the remote bash.
# remote_command SCRIPT_FILE VAR... ; array variables are written as arrays.
remote_command() {
  local script="$1" var decl header="" item
  shift
  for var in "$@"; do
    decl="$(declare -p "${var}" 2>/dev/null)" || die "internal: ${var} is not set"
    if [[ "${decl}" == "declare -a"* ]]; then
      local -n arr="${var}"
      header+="${var}=("
      for item in "${arr[@]}"; do header+=" $(shell_quote "${item}")"; done
      header+=" )"$'\n'
      unset -n arr
    else
      header+="${var}=$(shell_quote "${!var}")"$'\n'
    fi
  done
  # Comment lines are for readers of the file, not for the ssh command line.
  printf '%s%s' "${header}" "$(grep -v '^[[:space:]]*#' "${GCP_SCRIPT_DIR}/remote/${script}")"
}

# Run a remote script on every worker of the slice at once (gcloud runs the workers in
# parallel). Outside --dry-run the log line names the script rather than echoing its body.
ssh_all_workers() {
  local script="$1"
  shift
  local cmd=(gcloud compute tpus tpu-vm ssh "${TPU_NAME}" "${LOCATION[@]}" --worker=all)
  local command
  command="$(remote_command "${script}" "$@")"
  if [[ -n "${DRY_RUN}" ]]; then
    run_cmd "${cmd[@]}" --command="${command}"
    return 0
  fi
  info "+ $(shell_join "${cmd[@]}") --command=<scripts/gcp/remote/${script}>"
  "${cmd[@]}" --command="${command}"
}
