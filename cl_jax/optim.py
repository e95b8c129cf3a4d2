"""Optimizer and learning-rate schedule from the `optim` config block."""
import ml_collections
import optax


def lr_schedule(optim: ml_collections.ConfigDict, steps_per_epoch: int) -> optax.Schedule:
  """Linear warm-up for warmup_epochs, then cosine decay to 0 at the last step.

  lr(t) = lr * 0.5 * (1 + cos(pi * t' / T')) after warm-up (MoCo-v2's cosine
  schedule, applied per step instead of per epoch).
  """
  total = optim.epochs * steps_per_epoch
  warmup = optim.warmup_epochs * steps_per_epoch
  if warmup == 0:
    return optax.cosine_decay_schedule(optim.lr, total)
  return optax.warmup_cosine_decay_schedule(0.0, optim.lr, warmup, total, end_value=0.0)


def make_optimizer(optim: ml_collections.ConfigDict,
                   schedule: optax.Schedule) -> optax.GradientTransformation:
  """SGD with momentum and coupled weight decay on all parameters.

  g' = g + wd * w; v = mu * v + g'; w -= lr(t) * v  (torch.optim.SGD semantics).
  """
  return optax.chain(
      optax.add_decayed_weights(optim.weight_decay),
      optax.sgd(schedule, momentum=optim.momentum))
