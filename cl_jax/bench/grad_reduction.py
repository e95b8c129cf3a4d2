"""How the dtype of the cross-device gradient sum moves a bfloat16 network's first update.

python -m cl_jax.bench.grad_reduction [--devices=8,64] [--per_device=4] [--json]

Data parallelism over D devices: device d computes the gradient g_d of its share of the loss
on its own images (its own batch-norm statistics), and the update sums them. Here each g_d is
computed, one device after another on this machine, for the quick default's backbone
(ResNet-18, width 0.25, CIFAR stem, 32 px) under an NT-Xent loss (Chen et al. 2020, Eq. 1,
T = 0.5) between each image and a noisy copy, in two networks: bfloat16 computation with
float32 parameters (model.dtype=bfloat16) and float64 computation (the reference; its batch
norm keeps float32 statistics). The convolution kernels' gradients are then summed three ways:

  reference: float64 gradients, summed in float64;
  float32:   bfloat16 gradients cast to float32, summed in float32 (model.grad_reduce_dtype
             float32, cl_jax.models.conv);
  bfloat16:  bfloat16 gradients summed in bfloat16, rounded after each addition in ring order
             (d = 0, 1, ..., D-1), as a ring all-reduce accumulates each chunk, then cast to
             float32 (model.grad_reduce_dtype bfloat16, XLA's reduction of autodiff's gradient).

and each gives the first SGD-with-momentum update u = -lr (g + wd w) (momentum buffer = g at
step 1) with the quick default's lr and weight decay. Reported: ||u - u_ref|| / ||u_ref|| over
all kernels, the largest per-kernel relative error, and the bfloat16 sum's update against the
float32 sum's (the reduction's own rounding, without the bfloat16 computation's). The sums
are simulated because a CPU backend adds a bfloat16 all-reduce in float32; on TPUs and GPUs
the bfloat16 sum is the compiled program's (python -m cl_jax.bench.compile lists each
reduction's dtype). Run it with XLA_FLAGS=--xla_allow_excess_precision=false so that the CPU
rounds every bfloat16 value as an accelerator does (by default XLA may skip a round trip
through bfloat16).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from cl_jax.losses import simclr
from cl_jax.models.heads import l2_normalize
from cl_jax.models.resnet import ResNet
from configs import mocov2_patchns

_TEMPERATURE = 0.5
_NOISE = 0.1


def ring_sum(grads: list[np.ndarray], dtype) -> np.ndarray:
  """sum_d grads[d] accumulated in `dtype` in the order d = 0, 1, ..., rounded to `dtype`
  after each addition (a ring all-reduce's accumulation of one chunk)."""
  total = np.asarray(grads[0]).astype(dtype)
  for g in grads[1:]:
    total = (total.astype(np.float64) + np.asarray(g).astype(dtype).astype(np.float64)).astype(
        dtype
    )
  return total


def relative_errors(got: dict, want: dict) -> tuple[float, float]:
  """(||got - want|| / ||want|| over all arrays together, max over arrays of the same ratio
  per array), in float64; got and want map names to arrays."""
  num = sum(float(np.sum((np.float64(got[k]) - want[k]) ** 2)) for k in want)
  den = sum(float(np.sum(np.float64(want[k]) ** 2)) for k in want)
  per = max(
      float(np.linalg.norm(np.float64(got[k]) - want[k]) / np.linalg.norm(want[k])) for k in want
  )
  return float(np.sqrt(num / den)), per


def _kernels(tree) -> dict:
  """The convolution kernels of a parameter tree, by path."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in flat if "kernel" in str(p[-1])}


def _network(dtype) -> ResNet:
  """The quick default's backbone computing in `dtype` (float32 parameters), with batch-norm
  statistics over each device's images."""
  model = mocov2_patchns.get_config(None).model
  return ResNet(
      depth=model.depth,
      stem=model.stem,
      width_multiplier=model.width_multiplier,
      dtype=dtype,
      bn_groups=1,
  )


def inputs(devices: int, per_device: int, seed: int = 0) -> tuple:
  """(images, noisy copies, the network's float32 variables): devices * per_device images of
  32 px as NumPy float32 arrays."""
  shape = (devices * per_device, 32, 32, 3)
  images = jax.random.uniform(jax.random.key(seed), shape)
  noisy = images + _NOISE * jax.random.normal(jax.random.key(seed + 1), shape)
  variables = _network(jnp.float32).init(jax.random.key(seed + 2), images[:2], train=False)
  return np.asarray(images), np.asarray(noisy), jax.tree.map(np.asarray, variables)


def device_grads(images, noisy, variables, devices: int, dtype) -> list[dict]:
  """[The kernel gradients of device d's share of the loss, for d < devices], the network
  computing in `dtype`; device d holds the d-th of `devices` equal slices of the images.
  In float64 the parameters are float64 copies of the float32 ones."""
  net = _network(dtype)
  per_device = len(images) // devices

  def share(params, x1, x2):
    z = []
    for x in (x1, x2):
      out, _ = net.apply(
          {"params": params, "batch_stats": variables["batch_stats"]},
          x.astype(dtype),
          train=True,
          mutable=["batch_stats"],
      )
      z.append(l2_normalize(out["pooled"]))  # float32, as the float32 head receives it
    loss, _ = simclr.nt_xent_loss(z[0], z[1], _TEMPERATURE)
    return loss / devices  # the device's share of the mean over devices

  grad = jax.jit(jax.grad(share))
  params = variables["params"]
  if jnp.dtype(dtype) == jnp.float64:
    params = jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), params)
  out = []
  for d in range(devices):
    rows = slice(d * per_device, (d + 1) * per_device)
    x1, x2 = (jnp.asarray(v[rows], dtype) for v in (images, noisy))
    out.append(_kernels(grad(params, x1, x2)))
  return out


def measure(devices: int, per_device: int) -> dict:
  """Relative errors of the float32- and bfloat16-reduced first update against the float64
  reference (module docstring) at `devices` simulated devices."""
  optim = mocov2_patchns.get_config(None).optim
  images, noisy, variables = inputs(devices, per_device)
  kernels = _kernels(variables["params"])
  low = device_grads(images, noisy, variables, devices, jnp.bfloat16)
  with jax.enable_x64(True):
    high = device_grads(images, noisy, variables, devices, jnp.float64)
  names = list(kernels)
  # Each device's weight gradient as a bfloat16 convolution outputs it (a CPU may keep more
  # precision: XLA's xla_allow_excess_precision).
  low = [{n: g[n].astype(jnp.bfloat16) for n in names} for g in low]

  def update(grad: dict) -> dict:
    return {
        n: -optim.lr * (np.float64(grad[n]) + optim.weight_decay * np.float64(kernels[n]))
        for n in names
    }

  want = update({n: ring_sum([g[n] for g in high], np.float64) for n in names})
  result = {"devices": devices, "per_device": per_device, "kernels": len(names)}
  got = {}
  for reduce_dtype in (np.float32, jnp.bfloat16):
    name = np.dtype(reduce_dtype).name
    got[name] = update({n: ring_sum([g[n] for g in low], reduce_dtype) for n in names})
    result[name], result[f"{name}_max_per_kernel"] = relative_errors(got[name], want)
  # The bfloat16 sum's own rounding: against the float32 sum of the same gradients.
  result["bfloat16_vs_float32"] = relative_errors(got["bfloat16"], got["float32"])[0]
  return result


def main(argv):
  del argv
  rows = [measure(int(d), flags.FLAGS.per_device) for d in flags.FLAGS.devices]
  if flags.FLAGS.json:
    print(json.dumps(rows))
    return
  print(
      "| devices | images per device | float32 sum | bfloat16 sum | worst kernel: f32, bf16 "
      "| bfloat16 sum vs float32 sum |"
  )
  print("|---:|---:|---:|---:|---|---:|")
  for r in rows:
    print(
        f"| {r['devices']} | {r['per_device']} | {r['float32']:.2e} | {r['bfloat16']:.2e} | "
        f"{r['float32_max_per_kernel']:.2e}, {r['bfloat16_max_per_kernel']:.2e} | "
        f"{r['bfloat16_vs_float32']:.2e} |"
    )


if __name__ == "__main__":  # flags defined here: the module's functions are imported by tests
  flags.DEFINE_list("devices", ["8", "64"], "Simulated device counts.")
  flags.DEFINE_integer("per_device", 4, "Images per device.")
  flags.DEFINE_bool("json", False, "Print one JSON line instead of the table.")
  app.run(main)
