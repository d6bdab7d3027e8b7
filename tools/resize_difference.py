"""How much openpi's resize (ours) and LeRobot's differ on camera frames that are not 224 x 224.

Both keep the aspect ratio and pad to 224 x 224 centred with black. openpi's training pipeline
(``ResizeImages`` -> ``openpi_client.image_tools.resize_with_pad``) resizes uint8 frames with
PIL's bilinear filter, which widens its kernel when shrinking (antialiased); LeRobot's pi05
(``resize_with_pad_torch``) resizes float frames with ``F.interpolate(bilinear,
align_corners=False)`` and no antialiasing. This prints the difference, in the model's input
units ([-1, 1]), on frames of the synthetic DROID-like bag rendered at each size::

    python tools/resize_difference.py [--sizes 640x480 1280x720 320x240]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F


def lerobot_resize(image: np.ndarray, size: int = 224) -> torch.Tensor:
    """LeRobot >= 0.5: float [0, 1] -> F.interpolate bilinear (no antialias), centred, 0-padded; -> [-1, 1]."""
    x = torch.from_numpy(image).float().permute(2, 0, 1)[None] / 255.0
    h, w = x.shape[-2:]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    x = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0, 1)
    top, left = divmod(size - rh, 2), divmod(size - rw, 2)
    x = F.pad(x, (left[0], left[0] + left[1], top[0], top[0] + top[1]), value=0.0)
    return x[0] * 2 - 1


def main() -> None:
    from mstar_graphs.pi05.siglip import preprocess_images
    from mstar_ros.bag.synthetic import SyntheticBagSpec, synthetic_messages

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["640x480", "1280x720", "320x240"])
    parser.add_argument("--frames", type=int, default=20)
    args = parser.parse_args()
    for size in args.sizes:
        w, h = map(int, size.split("x"))
        spec = SyntheticBagSpec(robots=1, seconds=2.0, seed=0, width=w, height=h)
        diffs = []
        for m in synthetic_messages(spec):
            if "image" not in m.topic:
                continue
            img = np.asarray(m.msg.data, dtype=np.uint8).reshape(h, w, 3)
            ours = preprocess_images(torch.from_numpy(img), 224)[0]
            diffs.append((ours - lerobot_resize(img)).abs())
            if len(diffs) == args.frames:
                break
        d = torch.stack(diffs)
        print(
            f"{size}: mean |openpi - lerobot| = {d.mean():.4f}, p99 {d.flatten().quantile(0.99):.4f}, "
            f"max {d.max():.4f} (in [-1, 1] units; 1/127.5 = {1 / 127.5:.4f} is one uint8 step), "
            f"{len(diffs)} frames"
        )


if __name__ == "__main__":
    main()
