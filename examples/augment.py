"""A per-sample augmentation written in Python, for `shardflow profile --map
examples.augment:augment` (the README's input-bound example): it flips and jitters the
28x28 images of the README's first example."""

import numpy as np


def augment(row: dict) -> dict:
    image = np.asarray(row["image"]).reshape(28, 28)[:, ::-1]
    noise = np.random.default_rng(int(row["label"])).integers(-8, 8, image.shape)
    return {"image": np.clip(image + noise, 0, 255).astype(np.uint8).reshape(-1)}
