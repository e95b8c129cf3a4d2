"""The code version of a study's run: a digest of its source and a numerics fingerprint.

python -m cl_jax.analysis.fingerprint --workdir=RUN   (writes RUN/fingerprint.json)

Two runs are comparable only if the same arithmetic produced them: a refactor that changes how a
step is computed (the order of a sum, a hand-written backward) changes every later number of a
run, though its maths stays the same. The fingerprint detects such a change from the numbers
themselves. It is the loss and gradient norm of one train step, from a fixed initialisation on a
fixed synthetic batch, of each component of the run's method: the base step (the method, and for
MoCo whether it is symmetric), each enabled add-on (non-semantic negatives of each kind, FT, IFM,
hard negatives, DICR, LooC), MoCo's shuffle-BN by statistics and the ImageNet stem. Each component's
step runs a canonical tiny config (the method's quick config at batch 8, a ResNet-10 of width 0.25,
float32, the add-on alone at its defaults), not the run's own settings, so arms that differ in a
setting (patch negatives at alpha 1 and alpha 3) share the component's fingerprint, and a comparison
checks every component its records have in common (cl_jax.analysis.study_summary). The values are
float32 and exact: the same code on the same processor's arithmetic gives the same bits (README
"Reproducibility": another processor may not). The command computes them on one core: XLA's CPU
kernels split their sums over as many threads as the process has cores, which changes the last
bits, and a study's runs have as many cores as their launcher gives them (cl_jax.study --workers).

The source digest is a SHA-256 over the tracked files of cl_jax/ and configs/ (paths and
contents), which names a code version whether or not it is committed; the study runner stores
it before a run starts and refuses a record whose run ended under other source
(cl_jax.analysis.study_runs).
"""

import hashlib
import json
import os
import subprocess

import ml_collections

from cl_jax.runtime import cli, metrics, run_config
from cl_jax.runtime.errors import UsageError

FILE = "fingerprint.json"
SOURCE_FILE = "source.json"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIRS = ("cl_jax", "configs")


def source_digest(root: str = ROOT) -> dict:
  """{"sha256": digest of the code, "commit": the short commit, "-dirty" when a file git tracks
  under SOURCE_DIRS differs from it, or "" outside a git checkout}: the digest covers every file
  git tracks under SOURCE_DIRS (or, outside a git checkout, every .py file there), read as it is
  on disk now. Files outside SOURCE_DIRS (a study's records, the docs) leave both unchanged."""
  listed = subprocess.run(
      ["git", "ls-files", "-z", "--", *SOURCE_DIRS],
      cwd=root,
      capture_output=True,
      check=False,
  )
  if listed.returncode == 0 and listed.stdout:
    files = sorted(p for p in listed.stdout.decode().split("\0") if p)
  else:
    files = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for top in SOURCE_DIRS
        for d, _, names in os.walk(os.path.join(root, top))
        for f in names
        if f.endswith(".py")
    )
  h = hashlib.sha256()
  for rel in files:
    path = os.path.join(root, rel)
    if os.path.isfile(path):
      with open(path, "rb") as f:
        h.update(rel.encode() + b"\0" + f.read() + b"\0")

  def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, check=False
    ).stdout.decode()

  commit = git("rev-parse", "--short", "HEAD").strip()
  if commit and git("status", "--porcelain", "--untracked-files=no", "--", *SOURCE_DIRS).strip():
    commit += "-dirty"
  return {"sha256": h.hexdigest(), "commit": commit}


def components(config: ml_collections.ConfigDict) -> list[str]:
  """The components of a run's config: its base step (its method's entry's, e.g. "moco",
  "moco_symmetric", "simclr", "byol", "simsiam") and one "<base>+<add-on>" per enabled add-on
  (cl_jax.addons.ADDONS; non-semantic negatives by kind: "+nonsemantic_patch",
  "+nonsemantic_texture"); a method configured as a variant of another (LooC, MoCo with
  looc.enabled) is one more, "+looc"; MoCo's key encoder with shuffle-BN by statistics
  (model.bn_mode "shuffle_stats", other arithmetic than "shuffle") is one more,
  "+shuffle_stats"; a ResNet with the ImageNet stem (7x7/2 convolution, BN with its ReLU, the
  3x3/2 max-pool and its hand-written backward, cl_jax.models.pooling) is one more,
  "+imagenet_stem"; a bfloat16 network (model.dtype, whose views are also held in bfloat16
  between the augmentation's passes, cl_jax.data.photometric) is one more, "+bfloat16"."""
  from cl_jax import addons, objectives

  method = objectives.method_of(config)
  base = method.component(config)
  out = [base]
  if method.shuffle_bn and config.model.bn_mode == "shuffle_stats":
    out.append(f"{base}+shuffle_stats")
  if config.model.stem == "imagenet":
    out.append(f"{base}+imagenet_stem")
  if config.model.dtype == "bfloat16":
    out.append(f"{base}+bfloat16")
  out += [f"{base}+{addons.component(addon, config)}" for addon in addons.enabled(config)]
  if method.name != config.method:
    out.append(f"{base}+{method.name}")
  return out


def canonical_config(component: str) -> ml_collections.ConfigDict:
  """The tiny config whose one step fingerprints `component` (module docstring); a method
  variant's component ("moco+looc") starts from the variant's own quick config."""
  from cl_jax import addons, objectives

  base, _, addon = component.partition("+")
  variants = {m.name: m for m in objectives.ENTRIES if m.name not in objectives.METHODS}
  method = variants.get(addon) or objectives.METHODS[base.removesuffix("_symmetric")]
  c = cli._load_config(os.path.join(ROOT, method.config_file))
  if base == "moco_symmetric":
    c.moco.symmetric = True
  if addon == "shuffle_stats":
    c.model.bn_mode = addon
  elif addon == "imagenet_stem":
    c.model.stem = "imagenet"
  elif addon and addon != "bfloat16" and addon not in variants:
    block, _, value = addon.partition("_")
    c[block].enabled = True
    if value:
      c[block][addons.ADDONS[block].VARIANT] = value
  c.seed = 0
  c.optim.batch_size = 8
  c.moco.queue_size = 64
  c.model.update(depth=10, width_multiplier=0.25)
  c.model.dtype = "bfloat16" if addon == "bfloat16" else "float32"
  return c


def step_fingerprint(config: ml_collections.ConfigDict) -> list[float]:
  """[loss, gradient norm] of one train step of `config` on one device from its fresh state
  (config.seed) at the last epoch's step on the synthetic batch of seed 0
  (cl_jax.train.synthetic_batch), as float32 values; the gradient norm is the root of the
  summed squares of the per-layer norms."""
  import jax
  import numpy as np

  from cl_jax import train

  step, state, data = train.synthetic_step(config, devices=1, statistics=True)
  # The last epoch's step (one step per epoch here): every add-on scheduled by epoch (DICR's
  # lambda, FT's start epoch) is on.
  _, out = step(state.replace(step=state.step + config.optim.epochs - 1), data)
  out = jax.device_get(out)
  norms = np.array([v for k, v in out.items() if k.startswith("grad_norm/")], np.float32)
  return [float(np.float32(out["loss"])), float(np.sqrt(np.sum(norms * norms, dtype=np.float32)))]


def fingerprint(config: ml_collections.ConfigDict) -> dict:
  """{component: [loss, gradient norm]} for every component of `config`."""
  return {name: step_fingerprint(canonical_config(name)) for name in components(config)}


def differing(a: dict, b: dict) -> list[str]:
  """The components that fingerprints `a` and `b` both hold with other values."""
  return sorted(k for k in set(a) & set(b) if a[k] != b[k])


def main(argv):
  del argv
  import jax
  from absl import flags

  workdir = flags.FLAGS.workdir
  # One core, before JAX's CPU backend starts its threads (module docstring).
  os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  with cli.report():
    if not workdir or not os.path.exists(os.path.join(workdir, "config.json")):
      raise UsageError(f"--workdir={workdir} holds no run (no config.json)")
    config = run_config.read(workdir)
    # The device the components were computed on, the run's own (a study's record names it).
    out = {
        "components": fingerprint(config),
        "source": source_digest(),
        "device": jax.devices()[0].device_kind,
    }
    path = os.path.join(workdir, FILE)
    metrics.write_atomically(path, json.dumps(out, indent=1))
    print(path)


if __name__ == "__main__":
  from absl import app, flags

  flags.DEFINE_string("workdir", None, "Run directory (its config.json names the method).")
  app.run(main, flags_parser=cli.parse_flags)
