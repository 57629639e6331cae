"""The process group of a bench script run under torchrun."""

from __future__ import annotations

import datetime
import os


def init(device: str, minutes: float) -> str:
    """Joins torchrun's process group: NCCL with this process's GPU (``LOCAL_RANK``) for ``device="cuda"``, gloo for
    ``"cpu"``, each collective bounded by ``minutes``. Returns this rank's device ("cuda:N" or "cpu")."""
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(minutes=minutes)
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
        dist.init_process_group("nccl", device_id=torch.device(dev), timeout=timeout)
        return dev
    dist.init_process_group("gloo", timeout=timeout)
    return "cpu"
