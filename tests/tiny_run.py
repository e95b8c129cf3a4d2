"""The tiny pretraining run shared by the subprocess tests: its flags and environment."""

import os

# MoCo-v2 + patch negatives on 16 px Trifeature, ResNet-18 x0.125, batch 32 (8 steps/epoch).
FLAGS = [
    "--config=configs/mocov2_patchns.py",
    "--config.data.image_size=16",
    "--config.data.trifeature_train=256",
    "--config.data.trifeature_test=128",
    "--config.model.width_multiplier=0.125",
    "--config.model.head_hidden_dim=32",
    "--config.model.head_out_dim=16",
    "--config.moco.queue_size=128",
    "--config.nonsemantic.patch_min=2",
    "--config.nonsemantic.patch_max=6",
    "--config.optim.batch_size=32",
    "--config.train.log_every=1",
]


def env(devices: int = 1) -> dict:
  """The test process's environment with `devices` simulated CPU devices."""
  out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out["JAX_NUM_CPU_DEVICES"] = str(devices)
  out["JAX_PLATFORMS"] = "cpu"
  return out
