# shellcheck shell=bash
# Runs on each TPU worker, sent by setup.sh with REPO_URL, GIT_REF, TARBALL_NAME, PYTHON_VERSION
# and EXTRA_PIP assigned above this text.
set -euo pipefail
: "${REPO_URL?}" "${GIT_REF?}" "${TARBALL_NAME?}" "${PYTHON_VERSION?}" "${EXTRA_PIP?}"
host="$(hostname)"
repo="${HOME}/rljax"
venv="${HOME}/rljax-venv"
pid_file="${HOME}/rljax_logs/rljax.pid"

if [[ -f "${pid_file}" ]] && kill -0 "$(cat "${pid_file}")" 2>/dev/null; then
  echo "${host}: rljax is running (pid $(cat "${pid_file}")); stop it with stop.sh before setup" >&2
  exit 3
fi

if [[ -n "${REPO_URL}" ]]; then
  mkdir -p "${repo}"
  cd "${repo}"
  [[ -d .git ]] || git init --quiet
  git remote remove origin 2>/dev/null || true
  git remote add origin "${REPO_URL}"
  git fetch --quiet --depth=1 origin "${GIT_REF}"
  git checkout --quiet --force --detach FETCH_HEAD
  echo "${host}: ~/rljax at ${GIT_REF} ($(git rev-parse --short HEAD))"
else
  # Replace the tree wholesale so files deleted upstream do not linger.
  rm -rf "${repo}"
  mkdir -p "${repo}"
  tar -xzf "${HOME}/${TARBALL_NAME}" -C "${repo}"
  rm -f "${HOME}/${TARBALL_NAME}"
  echo "${host}: ~/rljax unpacked from the shipped checkout"
fi

# TPU images ship an older system Python than rljax needs; uv fetches the requested one.
uv="$(command -v uv || true)"
if [[ -z "${uv}" ]]; then
  uv="${HOME}/.local/bin/uv"
  [[ -x "${uv}" ]] || python3 -m pip install --quiet --user uv
fi
[[ -x "${venv}/bin/python" ]] || "${uv}" venv --quiet --python "${PYTHON_VERSION}" "${venv}"
# EXTRA_PIP is a space-separated list by design, so it is split into words here.
# shellcheck disable=SC2086
"${uv}" pip install --quiet --python "${venv}/bin/python" -e "${repo}" 'jax[tpu]' ${EXTRA_PIP} \
  --find-links https://storage.googleapis.com/jax-releases/libtpu_releases.html
# Import only: touching the TPU here would hold the chips and, on a pod, wait for other hosts.
"${venv}/bin/python" -c 'import jax, rljax; print("rljax ready, jax", jax.__version__)' |
  sed "s/^/${host}: /"
