"""The fault schedule's `--command` handler: the same start/end lines as nqfault.handle, written
by the command itself. <pid> is the consumer's (the parent), <token> is 0 (a command is not told
its claim), and c=<pid> names the command's own process; flag C marks a command run.

Payload {"s": seconds}: how long the command runs (within command_timeout_s, past the lease).
"""

import json
import os
import sys
import time


def main() -> None:
    payload = json.loads(sys.stdin.read() or "{}")
    deploy = os.environ.get("NQF_DEPLOY", "main")
    job, attempt, parent = os.environ["NOTIFYQ_JOB_ID"], os.environ["NOTIFYQ_ATTEMPT"], os.getppid()
    path = os.path.join(os.environ["NQF_OUT"], f"cmd{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (f"S {deploy} {job} {attempt} {parent} 0 {time.monotonic_ns()} {time.time_ns()} 0 0 "
                  f"f=C c={os.getpid()}\n").encode())
    time.sleep(float(payload.get("s", 0)) if isinstance(payload, dict) else 0)
    os.write(fd, f"E {deploy} {job} {attempt} {parent} 0 {time.monotonic_ns()} ok\n".encode())


if __name__ == "__main__":
    main()
