# shellcheck shell=bash
# Runs on each TPU worker, sent by launch.sh with the arrays LAUNCH_ARGS (launcher flags) and
# ENV_ASSIGNMENTS (KEY=VALUE) assigned above this text.
set -euo pipefail
: "${LAUNCH_ARGS[0]?}"
host="$(hostname)"
log_dir="${HOME}/rljax_logs"
pid_file="${log_dir}/rljax.pid"
log_file="${log_dir}/rljax.log"
launcher="${HOME}/rljax-venv/bin/rljax"
mkdir -p "${log_dir}"

if [[ -f "${pid_file}" ]] && kill -0 "$(cat "${pid_file}")" 2>/dev/null; then
  echo "${host}: rljax already running (pid $(cat "${pid_file}")); not launching another"
  exit 0
fi
[[ -x "${launcher}" ]] || {
  echo "${host}: ${launcher} missing; run scripts/gcp/setup.sh first" >&2
  exit 3
}
cd "${HOME}/rljax"
config="${LAUNCH_ARGS[0]#--config=}"
config="${config%%:*}"
[[ -f "${config}" ]] || {
  echo "${host}: config ${config} not found in ~/rljax; fix --config or rerun setup.sh" >&2
  exit 3
}

for assignment in "${ENV_ASSIGNMENTS[@]}"; do
  export "${assignment?}"
done
echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) ${host} launch: rljax ${LAUNCH_ARGS[*]}" >>"${log_file}"
# setsid + nohup + closed stdin detach the job from the ssh session, so it outlives it; the job
# is the direct child, so $! is its pid and SIGTERM from stop.sh reaches the launcher itself.
setsid nohup "${launcher}" "${LAUNCH_ARGS[@]}" >>"${log_file}" 2>&1 </dev/null &
echo "$!" >"${pid_file}"
echo "${host}: launched rljax (pid $!); log ${log_file}"
