"""A script torchrun launches (tests/test_distributed.py): each rank takes
device LOCAL_RANK, joins the default group with no backend named (torch
picks "neuron" for the accelerator), all-reduces a neuron tensor and writes
what it saw to <outdir>/rank<RANK>.json."""
import json
import os
import sys

import torch
import torch.distributed as dist

out = sys.argv[1]
local_rank = int(os.environ["LOCAL_RANK"])
torch.neuron.set_device(local_rank)
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1), device="neuron")
dist.all_reduce(t)
seen = [None] * world
dist.all_gather_object(seen, {"rank": rank, "node": int(os.environ.get("GROUP_RANK", 0)),
                              "device": str(t.device)})
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"sum": t[0].item(), "world": world, "backend": dist.get_backend_config(),
               "device_count": torch.neuron.device_count(), "seen": seen}, f)
dist.destroy_process_group()
