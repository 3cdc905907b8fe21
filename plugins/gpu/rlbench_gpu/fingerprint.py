"""The gpu plugin's fingerprint: torch's view of each CUDA device, or why there is none. Cheap when
no NVIDIA driver is loaded: torch is imported only when one is."""

from __future__ import annotations

import os
from typing import Any

from rlbench_gpu.capabilities import probe


def gpu_fingerprint() -> dict[str, Any]:
    if not os.path.exists("/proc/driver/nvidia/version"):
        return {"available": False, "reason": "no NVIDIA driver loaded (/proc/driver/nvidia/version is absent)"}
    found = probe()
    if not found.available:
        return {"available": False, "reason": found.reason}
    import torch

    from rlbench_gpu.device import device_fingerprint

    return {"available": True, "devices": [device_fingerprint(torch.device("cuda", i))
                                           for i in range(torch.cuda.device_count())]}
