# shellcheck shell=bash
# Runs on each TPU worker, sent by stop.sh with GRACE_SECONDS and FORCE assigned above this text.
set -euo pipefail
: "${GRACE_SECONDS?}" "${FORCE?}"
host="$(hostname)"
pid_file="${HOME}/rljax_logs/rljax.pid"

if ! [[ -f "${pid_file}" ]] || ! kill -0 "$(cat "${pid_file}")" 2>/dev/null; then
  echo "${host}: no rljax job running"
  rm -f "${pid_file}"
  exit 0
fi
pid="$(cat "${pid_file}")"
# The launcher saves a checkpoint on SIGTERM and exits 0; give it time to finish writing.
kill -TERM "${pid}"
echo "${host}: sent SIGTERM to rljax (pid ${pid}); waiting up to ${GRACE_SECONDS}s"
start="${SECONDS}"
while ((SECONDS - start < GRACE_SECONDS)); do
  if ! kill -0 "${pid}" 2>/dev/null; then
    echo "${host}: rljax stopped after $((SECONDS - start))s"
    rm -f "${pid_file}"
    exit 0
  fi
  sleep 0.2
done
if kill -0 "${pid}" 2>/dev/null; then
  if [[ -n "${FORCE}" ]]; then
    kill -KILL "${pid}"
    rm -f "${pid_file}"
    echo "${host}: rljax still running after ${GRACE_SECONDS}s; sent SIGKILL (the last checkpoint may be older)"
    exit 0
  fi
  echo "${host}: rljax (pid ${pid}) still running after ${GRACE_SECONDS}s; rerun stop.sh, or add --force to SIGKILL it" >&2
  exit 4
fi
echo "${host}: rljax stopped"
rm -f "${pid_file}"
