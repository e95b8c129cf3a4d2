"""Finished runs made by hand for the study tests: a run directory as cl_jax.main leaves it
(config.json, metrics.jsonl, the final fast-probe report) without training anything."""

import json

import numpy as np
from etils import epath

from cl_jax.analysis import fingerprint
from cl_jax.runtime import run_config

# Study-wide overrides that make a run 8 steps long on a small Trifeature split.
TINY = (
    ("data.trifeature_train", 256),
    ("data.trifeature_test", 128),
    ("optim.batch_size", 32),
    ("optim.epochs", 1),
)
STEPS = 8
LABELS = ("colour", "shape", "texture")


def accuracies(seed: int, offset: float) -> dict:
  """Deterministic top-1 fractions of the three labels for a fake run."""
  rng = np.random.default_rng(seed * 1000 + int(offset * 100))
  return {k: float(np.clip(offset + rng.uniform(0, 0.3), 0, 1)) for k in LABELS}


def make_run(
    directory,
    config,
    accuracy: dict,
    random_init: dict,
    std_sqrt_d=(0.5, 0.6),
    components: dict | None = None,
):
  """Write a finished run of `config` with the given probe accuracies (fractions) and its code
  fingerprint `components` (default: one made-up component), under the source digest the
  study runner stored in `directory` (else this checkout's) (cl_jax.analysis.fingerprint)."""
  d = epath.Path(directory)
  d.mkdir(parents=True, exist_ok=True)
  if not (d / fingerprint.SOURCE_FILE).exists():  # made without the study runner: this code
    (d / fingerprint.SOURCE_FILE).write_text(json.dumps(fingerprint.source_digest()))
  source = json.loads((d / fingerprint.SOURCE_FILE).read_text())
  printed = {"components": components or {"moco": [1.5, 2.5]}, "source": source}
  (d / fingerprint.FILE).write_text(json.dumps(printed))
  run_config.save_start(config, str(d), 0)
  rows = []
  for i, step in enumerate((4, STEPS)):
    rows.append(
        {
            "step": step,
            "loss": 5.0 - i,
            "lr": 0.1,
            "pos_mean": 0.5 + 0.1 * i,
            "neg_mean": 0.1 * i,
            "neg_var": 0.01,
            "health/std_sqrt_d": std_sqrt_d[i],
            "health/effective_rank": 10.0,
        }
    )
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  report = {
      "step": STEPS,
      "protocol": "fast",
      "accuracy": {k: {"top1": v, "top5": 1.0} for k, v in accuracy.items()},
      "random_init": {k: {"top1": v, "top5": 1.0} for k, v in random_init.items()},
  }
  (d / f"probe_step{STEPS}_fast.json").write_text(json.dumps(report))
