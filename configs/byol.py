"""BYOL (Grill et al. 2020): predictor, EMA target with the cosine momentum schedule, LARS.

Projector and predictor are Linear-BN-ReLU-Linear MLPs (4096 -> 256 at full
size). The ImageNet-100 preset is the BYOL setting of Ge et al. 2021 (App. C.1):
LARS, batch 1024, lr 4.8, weight decay 1e-6, cosine schedule, tau_base 0.996
(a fixed lr, as stated there; it does not scale with the batch).
The quick Trifeature run uses SGD like the MoCo runs.

python -m cl_jax.main --config=configs/byol.py[:imagenet100|:cifar10]
"""

from cl_jax import config_defaults

# The full-size presets' (tau_base, lr, batch, epochs); both LARS with weight decay 1e-6 and
# 10 warm-up epochs (Ge et al. 2021, App. C.1, for ImageNet-100).
_PAPER = {"imagenet100": (0.996, 4.8, 1024, 200), "cifar10": (0.99, 2.0, 512, 500)}


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.method = "byol"
  c.model.update(head_bn=True, bn_mode="sync", bn_groups=1, predictor_hidden_dim=128)
  c.byol.base_momentum = 0.99
  # DICR has no BYOL setting in its paper: SimSiam's tau, and its lambda x 4, since BYOL's loss
  # (2 - 2 cos per direction, summed) has 4x the gradient of SimSiam's (-cos / 2 per direction).
  c.dicr.update(weight=8.0, temperature=0.005)
  c.nonsemantic.alpha = 0.05  # Eq. 2's penalty when nonsemantic.enabled
  if c.preset == "trifeature":
    c.optim.epochs = 8  # learns in 312 steps; the MoCo runs need 16 (configs/config_defaults.py)
  elif c.preset in _PAPER:
    momentum, lr, batch_size, epochs = _PAPER[c.preset]
    c.model.update(head_hidden_dim=4096, head_out_dim=256, predictor_hidden_dim=4096)
    c.byol.base_momentum = momentum
    c.optim.update(
        optimizer="lars",
        lr_recipe="custom",
        lr=lr,
        batch_size=batch_size,
        batch_per_chip=0,  # the paper's global batch on any number of chips
        lr_reference_batch=0,
        weight_decay=1e-6,
        warmup_epochs=10,
        epochs=epochs,
    )
  else:
    raise ValueError(f"configs/byol.py has presets imagenet100 and cifar10, not {c.preset!r}")
  return c
