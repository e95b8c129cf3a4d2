"""Step efficiency: a train step's time over a plain supervised step of the same backbone.

python -m cl_jax.bench.efficiency --config=configs/mocov2_patchns.py [--rounds=5] [--steps=5]
    [--json]

A contrastive step does more work than a supervised one (a second encoder's forward, its
views' augmentation, the loss over a queue or batch), so its time alone says little about how
well it is compiled, and a comparison with another framework's step on a CPU mostly measures
the two frameworks' convolution kernels. The ratio here holds the backbone, the kernels and
the machine fixed: the supervised step is the same ResNet (config.model: depth, stem, width,
dtype, BN groups) with a linear classifier over CLASSES classes, softmax cross-entropy on the
uint8 view normalised as the pipeline does, train-mode batch norm, and the config's optimizer,
at the same global batch, on one device, with donated buffers kept in the layouts the
compiler chooses, as the train step's are (cl_jax.runtime.layouts). Both are compiled, then timed
alternately in the same process (--rounds rounds of --steps steps each); the ratio of their
median round times is printed beside the ratio of their FLOPs (XLA's cost analysis). A ratio
of times near the ratio of FLOPs says that the step spends its extra time on its extra work.
"""

import functools
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import flags

from cl_jax import optim, train
from cl_jax.bench import flops as bench_flops
from cl_jax.bench import memory as bench_memory
from cl_jax.data import photometric
from cl_jax.models.encoder import encoder_for
from cl_jax.runtime import cli
from cl_jax.runtime.layouts import StepJit

CLASSES = 1000


class Classifier(nn.Module):
  """backbone (images -> dict with pooled (B, D)) followed by a linear layer to (B, classes)
  float32 logits."""

  backbone: nn.Module
  classes: int

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    pooled = self.backbone(x, train=train)["pooled"]
    return nn.Dense(self.classes, dtype=jnp.float32, name="classifier")(pooled)


def supervised_step(config: ml_collections.ConfigDict):
  """(step, state, batch): the jitted supervised step of config's backbone on one device,
  step(state, batch) -> (state, loss) with the state (params, batch_stats, opt_state)
  donated, a fresh state, and a synthetic batch of config.optim.batch_size uint8 views
  (B, S, S, 3) with int32 labels (B,)."""
  model = Classifier(encoder_for(config).backbone, CLASSES)
  batch, size = config.optim.batch_size, config.data.image_size
  tx = optim.make_optimizer(config.optim, optim.lr_schedule(config.optim, 1))
  spec = photometric.config_spec(config)
  # Drawn with the rbg PRNG and compiled whole, as state.init_variables does: threefry op by op
  # compiles one sampler per parameter shape.
  key = jax.random.key(config.seed, impl="rbg")
  variables = jax.jit(functools.partial(model.init, train=False))(
      key, jnp.zeros((2, size, size, 3))
  )
  state = (variables["params"], variables["batch_stats"], jax.jit(tx.init)(variables["params"]))

  def step(state, data):
    params, batch_stats, opt_state = state
    images = photometric.normalize(photometric.to_float(data["images"]), spec)

    def loss_fn(p):
      logits, mutated = model.apply(
          {"params": p, "batch_stats": batch_stats}, images, train=True, mutable=["batch_stats"]
      )
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, data["labels"]).mean()
      return loss, mutated["batch_stats"]

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

  rng = np.random.default_rng(0)
  data = {
      "images": rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
      "labels": rng.integers(0, CLASSES, batch).astype(np.int32),
  }
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state, data = jax.device_put((state, data), device)
  return StepJit(step, jax.tree.map(lambda _: device, state), (device,), device), state, data


def _round_time(compiled, state, data, steps: int):
  """(state after `steps` calls, wall time of the calls in seconds)."""
  start = time.perf_counter()
  for _ in range(steps):
    state, out = compiled(state, data)
  jax.block_until_ready((state, out))
  return state, time.perf_counter() - start


def measure(config: ml_collections.ConfigDict, rounds: int, steps: int) -> dict:
  """Times config's lean train step and the supervised step alternately.

  Returns dict: device_kind, setup (words), step_ms and supervised_ms (median round time / steps),
  time_ratio (median over rounds of step time / supervised time in the same round), flop_ratio
  (XLA's FLOPs of the step over the supervised step's), gflop_per_image and
  supervised_gflop_per_image (per image of the global batch).
  """
  batch = config.optim.batch_size
  step, state, data = train.synthetic_step(config, 1)
  sup, sup_state, sup_data = supervised_step(config)
  lowered, sup_lowered = step.lower(state, data), sup.lower(sup_state, sup_data)
  compiled, sup_compiled = step.record(lowered.compile()), sup.record(sup_lowered.compile())
  state, sup_state = step.place(state), sup.place(sup_state)
  flops = bench_flops.step_flops(lowered, 1)
  sup_flops = bench_flops.step_flops(sup_lowered, 1)
  state, _ = _round_time(compiled, state, data, 2)  # warm-up
  sup_state, _ = _round_time(sup_compiled, sup_state, sup_data, 2)
  times, sup_times = [], []
  for _ in range(rounds):
    state, t = _round_time(compiled, state, data, steps)
    sup_state, t_sup = _round_time(sup_compiled, sup_state, sup_data, steps)
    times.append(t / steps)
    sup_times.append(t_sup / steps)
  ratios = np.array(times) / np.array(sup_times)
  return {
      "device_kind": jax.devices()[0].device_kind,
      "setup": f"{bench_memory.setup(config, batch)}; {rounds} alternating rounds of {steps} steps",
      "step_ms": round(1e3 * float(np.median(times)), 2),
      "supervised_ms": round(1e3 * float(np.median(sup_times)), 2),
      "time_ratio": round(float(np.median(ratios)), 3),
      "time_ratio_range": [round(float(ratios.min()), 3), round(float(ratios.max()), 3)],
      "flop_ratio": round(flops / sup_flops, 3),
      "gflop_per_image": round(flops / batch / 1e9, 4),
      "supervised_gflop_per_image": round(sup_flops / batch / 1e9, 4),
  }


def format_report(result: dict) -> str:
  """The measurement as a few lines of text."""
  low, high = result["time_ratio_range"]
  return "\n".join(
      [
          result["setup"],
          f"step {result['step_ms']:.2f} ms, supervised step {result['supervised_ms']:.2f} ms",
          f"time ratio {result['time_ratio']:.3f} (rounds {low:.3f}-{high:.3f}), FLOP ratio "
          f"{result['flop_ratio']:.3f} ({result['gflop_per_image']:.4g} / "
          f"{result['supervised_gflop_per_image']:.4g} GFLOP per image)",
      ]
  )


if __name__ == "__main__":
  cli.run_measurement(
      lambda: (
          flags.DEFINE_integer("rounds", 5, "Alternating timing rounds.", lower_bound=1),
          flags.DEFINE_integer("steps", 5, "Steps of each step per round.", lower_bound=1),
      ),
      lambda f: measure(f.config, f.rounds, f.steps),
      format_report,
  )
