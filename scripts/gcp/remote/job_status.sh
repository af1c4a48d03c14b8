# shellcheck shell=bash
# Runs on each TPU worker, sent by status.sh with LINES assigned above this text.
set -euo pipefail
: "${LINES?}"
host="$(hostname)"
pid_file="${HOME}/rljax_logs/rljax.pid"
log_file="${HOME}/rljax_logs/rljax.log"

if [[ -f "${pid_file}" ]] && kill -0 "$(cat "${pid_file}")" 2>/dev/null; then
  echo "${host}: RUNNING (pid $(cat "${pid_file}"))"
else
  echo "${host}: NOT RUNNING"
fi
if [[ -f "${log_file}" ]]; then
  tail -n "${LINES}" "${log_file}" | sed "s/^/${host}| /"
else
  echo "${host}| (no log yet: launch.sh has not run here)"
fi
