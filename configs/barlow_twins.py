"""Barlow Twins (Zbontar et al. 2021): the two views' cross-correlation driven to the identity.

Projector: three linear layers, batch norm and ReLU after the first two (Sec. 4, "Architecture");
lambda = 5e-3 (Sec. 4, "Loss function coefficient"); the paper's optimiser: LARS with lr 0.2 x
BatchSize / 256 and weight decay 1.5e-6 (Sec. 4, "Optimization"), one learning rate for every
parameter (the paper gives biases and batch-norm parameters 0.0048 instead of 0.2); views
aug-plus as for the other methods (the paper: BYOL's). The quick Trifeature run has a projector
of 512 units and no warm-up over its 8 epochs. :imagenet100 has the 8192-unit projector, 10
warm-up epochs and a cosine schedule, batch 512 rather than the paper's 2048 (the paper finds it
robust to the batch down to 256, Sec. 5) and 200 epochs.

python -m cl_jax.main --config=configs/barlow_twins.py[:imagenet100]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.method = "barlow_twins"
  c.dicr.update(weight=40.0, temperature=0.05)  # the paper gives none: SimCLR's (DICR, Sec. 4.1)
  c.model.update(
      head_bn=True,
      bn_mode="sync",
      bn_groups=1,
      head_layers=3,
      head_hidden_dim=512,
      head_out_dim=512,
  )
  c.optim.update(optimizer="lars", lr_recipe="custom", weight_decay=1.5e-6)
  if c.preset == "trifeature":
    c.optim.epochs = 8  # as the SimCLR and SimSiam runs
  elif c.preset == "imagenet100":
    c.model.update(head_hidden_dim=8192, head_out_dim=8192)
    c.optim.update(
        batch_size=512,
        batch_per_chip=0,  # one global batch on any number of chips
        lr_reference_batch=0,
        warmup_epochs=10,
        epochs=200,
    )
  else:
    raise ValueError(f"configs/barlow_twins.py has the preset imagenet100, not {c.preset!r}")
  config_defaults.scale_lr_with_batch(c.optim, 0.2)
  return c
