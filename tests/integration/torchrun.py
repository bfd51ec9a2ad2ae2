#!/usr/bin/python3
"""torchrun for Debian 12's python3-torch 1.13 on Python 3.11.

Why: torch 1.13's Std.from_str() finds the enum member with `for s in Std: if s == v`.
Since Python 3.11, iterating a Flag yields only canonical single-bit members, so
NONE (0) and ALL (3) are skipped and from_str("0") (the default of --redirects/--tee)
returns None; torchrun then dies in to_map() with
"'NoneType' object has no attribute 'get'" before launching anything.
Fix: build the member by value, Std(int(v)), which works on every Python version.

Usage: /usr/bin/python3 torchrun.py [torchrun options] prog args...   (torch 1.13
spells options with underscores: --nproc_per_node, --no_python, --max_restarts, ...)
"""
import os
import re
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.api import Std


def _from_str(vm):
    if re.match(api._VALUE_REGEX, vm):          # "0".."3" -> Std
        return Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):        # "0:3,1:0" -> {local_rank: Std}
        return {int(i): Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


Std.from_str = staticmethod(_from_str)  # run.py calls Std.from_str(args.redirects/tee)

# Optional, not a bug fix: TORCHRUN_KEEP_ALIVE="SECONDS,ATTEMPTS" (e.g. "1,3").
# torch 1.13 hard-codes the c10d/dynamic rendezvous heartbeat to every 5 s and declares a
# node dead after 3 missed ones (15 s); rdzv_conf cannot change it. A survivor cannot form a
# new round until the dead node expires, so this dominates the time to re-rendezvous.
# Cost of small values: a live agent stalled longer than SECONDS*ATTEMPTS is dropped.
if os.environ.get("TORCHRUN_KEEP_ALIVE"):  # unset or empty: torch's own heartbeat
    from datetime import timedelta
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    _secs, _tries = os.environ["TORCHRUN_KEEP_ALIVE"].split(",")
    _Settings = dr.RendezvousSettings

    def _settings(*a, **kw):  # only caller: DynamicRendezvousHandler.from_backend
        kw.update(keep_alive_interval=timedelta(seconds=float(_secs)),
                  keep_alive_max_attempt=int(_tries))
        return _Settings(*a, **kw)

    dr.RendezvousSettings = _settings

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main(sys.argv[1:]))
