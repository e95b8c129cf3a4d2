"""Optimizer and learning-rate schedule from the `optim` config block."""

import jax
import ml_collections
import optax


def lr_schedule(optim: ml_collections.ConfigDict, steps_per_epoch: int) -> optax.Schedule:
  """Linear warm-up for warmup_epochs, then cosine decay to 0 at the last step, or
  (optim.schedule = "step") the lr multiplied by 0.1 at each of optim.decay_epochs.

  cosine: lr(t) = lr * 0.5 * (1 + cos(pi * t' / T')) after warm-up (MoCo-v2's cosine
  schedule, applied per step instead of per epoch).
  step: lr(t) = lr * 0.1^(number of decay epochs e with e * steps_per_epoch <= t), the
  schedule of MoCo v1 and of LooC (Xiao et al. 2021, Sec. 4: x0.1 at epochs 300 and 400).
  """
  total = optim.epochs * steps_per_epoch
  warmup = optim.warmup_epochs * steps_per_epoch
  if optim.get("schedule", "cosine") == "step":
    boundaries = {int(e * steps_per_epoch) - warmup: 0.1 for e in optim.decay_epochs}
    decay = optax.piecewise_constant_schedule(optim.lr, boundaries)
    if warmup == 0:
      return decay
    ramp = optax.linear_schedule(0.0, optim.lr, warmup)
    return optax.join_schedules([ramp, decay], [warmup])
  if warmup == 0:
    return optax.cosine_decay_schedule(optim.lr, total)
  return optax.warmup_cosine_decay_schedule(0.0, optim.lr, warmup, total, end_value=0.0)


def _is_matrix(params):
  """True for kernels, False for biases and batch-norm scales/offsets (1-D leaves)."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


# optim.optimizer values (make_optimizer).
OPTIMIZERS = ("sgd", "lars")


def make_optimizer(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  """The optimizer named by optim.optimizer.

  sgd:  SGD with momentum and coupled weight decay on all parameters,
        g' = g + wd * w; v = mu * v + g'; w -= lr(t) * v  (torch.optim.SGD semantics).
  lars: optax.lars (You et al. 2017), as SimCLR and BYOL train: weight decay and the
        layer-wise trust ratio ||w|| / ||g'|| (coefficient 1e-3) on kernels only, biases
        and batch-norm parameters excluded (Grill et al. 2020, App. C).
  """
  if optim.optimizer == "lars":
    return optax.lars(
        schedule,
        weight_decay=optim.weight_decay,
        weight_decay_mask=_is_matrix,
        trust_ratio_mask=_is_matrix,
        momentum=optim.momentum,
    )
  if optim.optimizer != "sgd":
    raise ValueError(f"optim.optimizer must be 'sgd' or 'lars', got {optim.optimizer!r}")
  return optax.chain(
      optax.add_decayed_weights(optim.weight_decay), optax.sgd(schedule, momentum=optim.momentum)
  )
