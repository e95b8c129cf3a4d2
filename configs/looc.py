"""LooC (Xiao et al. 2021): MoCo v2 with leave-one-out heads, here for rotation.

The quick Trifeature run adds rotation by 90/180/270 degrees (p 0.5) to the
quick MoCo-v2 recipe and gives it its own head and key view; the probe also
reads 4-way rotation (Table 1). The same run without LooC is
`configs/mocov2.py --config.aug.rotation_prob=0.5 --config.probe.rotation=True`
("MoCo + Rotation"). Other atomic augmentations: colour and texture, e.g.
--config.looc.augmentations='("colour", "rotation")' (Table 2), texture with
--config.aug.texture_prob=0.5.

:imagenet100 has the paper's settings (Sec. 4, App. A, C): ResNet-50, a 2-layer
MLP head with a 2048-d hidden layer per embedding space, one queue of 16384 keys
per head, batch 256, 500 epochs with the lr x0.1 at epochs 300 and 400, MoCo
v2's lr 0.03, T 0.2, m 0.999; the linear probe 200 epochs, lr 30 x0.1 at 60% and
80%, batch 256.

python -m cl_jax.main --config=configs/looc.py[:imagenet100]
"""

from cl_jax import config_defaults


def apply_looc(c, arg: str | None) -> None:
  """LooC with a rotation head on the preset `arg` (shared with configs/loocpp.py)."""
  c.looc.enabled = True
  c.looc.augmentations = ("rotation",)
  c.aug.rotation_prob = 0.5
  c.probe.rotation = True
  if c.preset == "imagenet100":
    c.moco.queue_size = 16384
    c.model.head_hidden_dim = 2048
    c.optim.update(
        lr_recipe="custom",
        lr=0.03,
        batch_size=256,
        batch_per_chip=0,  # the paper's global batch on any number of chips
        lr_reference_batch=0,
        epochs=500,
        schedule="step",
        decay_epochs=(300, 400),
    )
    c.probe.update(batch_size=256, epochs=200, lr=30.0, decay_epochs=(120, 160))
  elif c.preset != "trifeature":
    raise ValueError(
        f"configs/looc.py has presets trifeature (default) and imagenet100, got {arg!r}"
    )


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  apply_looc(c, arg)
  return c
