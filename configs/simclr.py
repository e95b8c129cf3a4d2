"""SimCLR (Chen et al. 2020): NT-Xent over the global batch, both directions, MLP head with BN.

The quick Trifeature run keeps the SGD recipe of the MoCo runs; the presets use
LARS with lr = 0.3 x batch / 256, weight decay 1e-6 and 10 warm-up epochs
(Chen et al. 2020, Sec. B.1 / App. B.9 for CIFAR-10); :trifeature128 is Robinson et al. 2021's
Trifeature setting (128 px, ResNet-18, 200 epochs) with the CIFAR-10 recipe's optimiser and
batch, which that paper does not give.

python -m cl_jax.main --config=configs/simclr.py[:imagenet100|:cifar10|:trifeature128]
"""

from cl_jax import config_defaults


def get_config(arg: str | None = None):
  c = config_defaults.with_preset(config_defaults.base_config(), arg)
  c.method = "simclr"
  c.model.update(head_bn=True, bn_mode="sync", bn_groups=1)
  c.simclr.temperature = 0.5
  c.dicr.update(weight=40.0, temperature=0.05)  # DICR's final lambda / tau for SimCLR (Sec. 4.1)
  if c.preset == "trifeature":
    c.optim.epochs = 8  # learns in 312 steps; the MoCo runs need 16 (configs/config_defaults.py)
  elif c.preset in ("imagenet100", "cifar10", "trifeature128"):
    # Sec. B.1 (App. B.9 for CIFAR-10): LARS, lr 0.3 x BatchSize / 256, wd 1e-6, 10 warm-up
    # epochs; T 0.1 on ImageNet, 0.5 on CIFAR-10 (and on Trifeature, whose runs set their T).
    imagenet = c.preset == "imagenet100"
    if imagenet:
      c.model.head_out_dim = 128
    c.simclr.temperature = 0.1 if imagenet else 0.5
    c.optim.update(
        optimizer="lars",
        lr_recipe="custom",
        batch_size=512,
        batch_per_chip=0,  # the paper's global batch on any number of chips
        lr_reference_batch=0,
        weight_decay=1e-6,
        warmup_epochs=10,
        epochs={"imagenet100": 200, "cifar10": 500, "trifeature128": 200}[c.preset],
    )
    config_defaults.scale_lr_with_batch(c.optim, 0.3)
  elif c.preset != "trifeature":
    raise ValueError(
        f"configs/simclr.py has presets imagenet100, cifar10 and trifeature128, not {c.preset!r}"
    )
  return c
