"""SimSiam (Chen & He 2021): predictor with a bottleneck, stop-gradient, no negatives, no EMA.

Projector: Linear-BN-ReLU layers with BN after its output layer too (3 layers
of 2048 at ImageNet size, 2 on CIFAR); predictor d -> d/4 -> d with BN in the
hidden layer. SGD, lr = base lr x batch / 256 with base lr 0.05 (0.03 on CIFAR),
momentum 0.9, weight decay 1e-4 (5e-4 on CIFAR), cosine schedule (Sec. 4 and
App. A, D).

python -m cl_jax.main --config=configs/simsiam.py[:imagenet100|:cifar10]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.method = "simsiam"
  c.dicr.update(weight=2.0, temperature=0.005)  # DICR's final lambda / tau for SimSiam (Sec. 4.1)
  c.model.update(
      head_bn=True,
      head_out_bn=True,
      bn_mode="sync",
      bn_groups=1,
      head_hidden_dim=128,
      head_out_dim=128,
      predictor_hidden_dim=32,
  )
  if c.preset == "trifeature":
    c.optim.epochs = 8  # learns in 312 steps; the MoCo runs need 16 (configs/config_defaults.py)
  elif c.preset == "imagenet100":
    c.model.update(head_layers=3, head_hidden_dim=2048, head_out_dim=2048, predictor_hidden_dim=512)
    c.optim.update(
        lr_recipe="custom",
        batch_size=512,
        batch_per_chip=0,
        lr_reference_batch=0,
        weight_decay=1e-4,
        epochs=200,
    )
    config_defaults.scale_lr_with_batch(c.optim, 0.05)  # Sec. 4: lr x BatchSize / 256, base lr 0.05
  elif c.preset == "cifar10":
    c.model.update(head_layers=2, head_hidden_dim=2048, head_out_dim=2048, predictor_hidden_dim=512)
    c.optim.update(lr_recipe="custom", batch_size=512, weight_decay=5e-4, epochs=800)
    config_defaults.scale_lr_with_batch(c.optim, 0.03)  # App. D (CIFAR-10): base lr 0.03
  elif c.preset != "trifeature":
    raise ValueError(f"configs/simsiam.py has presets imagenet100 and cifar10, not {c.preset!r}")
  return c
