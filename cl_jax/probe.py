"""The linear-probe job, an alias of python -m cl_jax.evaluate --evaluator=linear_probe
(cl_jax.evaluators.linear_probe) with the probe's own defaults.

python -m cl_jax.probe --workdir=runs/mocov2_patchns [--step=N] [--protocol=fast|logreg|paper]
    [--baseline=false] [--validation] [--features=backbone|heads] [--rotation]

With --baseline (the default) the report also gives the same probe on the
network at its random initialisation, computed once per configuration and cached.
With --validation the fast and logreg probes fit four fifths of the training
split and report the held-out fifth (for tuning; the test split stays unseen).
--features and --rotation override the run config's probe.features (LooC's head
features) and probe.rotation (the 4-way rotation task).
"""

from absl import app, flags

from cl_jax import evaluate
from cl_jax.evaluators import features, linear_probe, registry
from cl_jax.runtime import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints/.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")


def _config_choice(name: str, choices, what: str) -> flags.FlagHolder:
  """An enum flag whose default is the run config's probe.<name>."""
  return flags.DEFINE_enum(
      name, None, list(choices), f"{what} (default: the run config's probe.{name})."
  )


_PROTOCOL = _config_choice("protocol", linear_probe.PROTOCOLS, "Probe protocol")
_BASELINE = flags.DEFINE_bool(
    "baseline", True, "Also probe the randomly initialised network " "(cached per configuration)."
)
_VALIDATION = flags.DEFINE_bool(
    "validation",
    False,
    "Report the held-out fifth of the " "training split instead of the test split (fast, logreg).",
)
_FEATURES = _config_choice("features", tuple(features.FEATURE_OUTPUTS), "Features to probe")
_ROTATION = flags.DEFINE_bool(
    "rotation", None, "Also probe 4-way rotation (default: the run config's probe.rotation)."
)


def main(argv):
  cli.start_reader(argv, _WORKDIR.value, "probe")
  with cli.report():
    holders = (_PROTOCOL, _BASELINE, _VALIDATION, _FEATURES, _ROTATION)
    options = {holder.name: holder.value for holder in holders}
    evaluate.print_reports(
        registry.evaluate(_WORKDIR.value, ("linear_probe",), _STEP.value, **options)
    )


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
