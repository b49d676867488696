"""Runs a command as a client of a private MPS server (`ddtree.mps.MpsServer`, as `ddtree
serve` starts one), optionally beside idle clients: processes that hold a CUDA context and
some memory under the same server and launch nothing, as the drafter service does while its
verifier serves ar (lease 44: ar c8 in process as the only client -1.2%, through serve beside
the drafter -3.5%; is the second client the difference?).

    python3 scripts/gpu/under_mps.py [--idle-clients N] -- command args...
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from ddtree.mps import MpsServer

IDLE = ("import sys, time, torch\n"
        "held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle-clients", type=int, default=0)
    parser.add_argument("--idle-bytes", type=int, default=1 << 30)
    parser.add_argument("--idle-percentage", type=int, default=0,
                        help="the idle clients' CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (0: unset)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run")
    # a `timeout` around this script: the idle clients and the server go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with MpsServer("cuda", required=True) as mps:
        env = {**os.environ, **mps.env}
        idle_env = dict(env)
        if args.idle_percentage:
            idle_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(args.idle_percentage)
        idle = [subprocess.Popen([sys.executable, "-c", IDLE, str(args.idle_bytes)], env=idle_env,
                                 stdout=subprocess.PIPE, text=True)
                for _ in range(args.idle_clients)]
        try:
            for process in idle:
                if process.stdout is None or process.stdout.readline().strip() != "ready":
                    print("an idle client did not start", file=sys.stderr)
                    return 3
            print(f"MPS client beside {len(idle)} idle client(s)", flush=True)
            return subprocess.run(command, env=env, check=False).returncode
        finally:
            for process in idle:
                process.kill()
                process.wait()


if __name__ == "__main__":
    sys.exit(main())
