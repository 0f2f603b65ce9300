"""What `mpiddp launch`'s failure and signal cases run (python launch_worker.py MODE DIR ...):
  fail DIR RANK CODE  every rank joins the process group; RANK then exits with CODE, the others wait
  kill DIR RANK       as fail, but RANK kills itself with SIGKILL
  signals         records each SIGUSR1/SIGTERM it gets in DIR/rank<R>.<SIGNAL>; DIR/rank<R>.ready when
                  listening; ends (status 0) on SIGTERM, goes on after SIGUSR1, waits at most 60 s"""
import os
import signal
import sys
import time

import torch.distributed as dist

mode, d = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode in ("fail", "kill"):
    dist.init_process_group("gloo")
    with open(os.path.join(d, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if rank == int(sys.argv[3]):
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(sys.argv[4]))
    time.sleep(120)  # the job must end long before
    sys.exit(0)


def note(sig, _frame):
    open(os.path.join(d, f"rank{rank}.{signal.Signals(sig).name}"), "w").close()
    if sig == signal.SIGTERM:
        sys.exit(0)


signal.signal(signal.SIGUSR1, note)
signal.signal(signal.SIGTERM, note)
open(os.path.join(d, f"rank{rank}.ready"), "w").close()
deadline = time.time() + 60
while time.time() < deadline:
    if os.path.exists(os.path.join(d, "stop")):
        sys.exit(0)
    time.sleep(0.1)
sys.exit(5)
