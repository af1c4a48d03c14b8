"""A pod on this machine: N processes x D CPU devices running one launcher command.

    python scripts/localhost_pod.py --processes 4 --devices 2 -- \
        --config=configs/arith_async.py --config.mesh.sampler_devices=4 \
        --config.mesh.learner_devices=4 --config.buffer.max_staleness=2 --workdir=/tmp/rljax/pod

Each process runs ``python -m rljax.launch <args>`` with ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set (``rljax.testing.pod``), as the workers of a
TPU pod slice would; ``{pid}`` in an argument becomes the process index. Logs go to
``--logdir/p<i>.txt``; process 0's is printed when the pod ends. Exits with the first non-zero
exit code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rljax.testing import pod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    p.add_argument("--logdir", default="/tmp/rljax/pod_logs")
    p.add_argument("--timeout", type=float, default=24 * 3600.0)
    p.add_argument("launch_args", nargs=argparse.REMAINDER, help="-- then the launcher's flags")
    args = p.parse_args()
    launch = [a for a in args.launch_args if a != "--"]
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    codes, logs = pod.run(
        ["-m", "rljax.launch", *launch],
        processes=args.processes,
        devices=args.devices,
        logdir=logdir,
        timeout=args.timeout,
    )
    print(logs[0][-4000:])
    print(f"exit codes {codes}; logs in {logdir}/p<i>.txt")
    sys.exit(next((c for c in codes if c), 0))


if __name__ == "__main__":
    main()
