"""A run's stored configs and the rule for changing them on resume.

A workdir keeps the config of its latest start in `config.json` (what the probe
and the plots read) and the config of every start in `config.step<N>.json`, N
the step that start resumed from (0 for the first). Both are written only once a
start has succeeded: the data opened and the checkpoint (if any) restored.

On resume the new config is compared with the stored one before anything in
the workdir is touched. Fields that define the run (method, model, data,
augmentation, loss, seed, batch) may not change: a different value there is a
different run and needs its own workdir. The fields of CHANGEABLE (logging,
checkpoint cadence, probe settings, health thresholds, the stall timeout, input workers, data
location, run length, learning rate and the gradient reduction's dtype) may
change with --allow_config_change.
The fields of an add-on switched off in both configs (<block>.enabled False, or a
block the stored config lacks) do nothing and may differ, and so may changeable
fields that the stored config lacks.
"""

import difflib
import json

import ml_collections
from etils import epath

from cl_jax.runtime.errors import UsageError

# Fields (or blocks, ending in ".") a resumed run may change with --allow_config_change.
CHANGEABLE = (
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.score_queries",
    "probe.",
    "eval.",
    "health.",
    "log.",
    "data.workers",
    "data.data_dir",
    "data.cache_dir",
    "data.texture_dir",
    "data.folder",
    "optim.epochs",
    "optim.decay_epochs",
    "optim.lr",
    "optim.base_lr",
    "optim.lr_recipe",
    "train.max_param_growth",
    "train.stall_timeout_s",
    "model.grad_reduce_dtype",
)
# The value `differences` shows for a field that one config lacks.
ABSENT = "<absent>"
# Fields stored as JSON lists that the config holds as tuples.
_TUPLES = (
    ("data", "crop_scale"),
    ("aug", "blur_sigma"),
    ("probe", "decay_epochs"),
    ("optim", "decay_epochs"),
    ("looc", "augmentations"),
    ("eval", "evaluators"),
)
# Fields that configs stored by earlier versions of cl_jax lack, with the value that does what
# those versions did: a stored config without the field resumes under that value unchanged.
INERT = {
    "aug.rotation_prob": 0.0,
    "aug.texture_prob": 0.0,
    "data.texture_dir": "",
    "data.folder": "",
    "optim.batch_per_chip": 0,
    "optim.lr_reference_batch": 0,
    "data.bad_images": "stop",
    "data.decoder": "pil",
    "data.trifeature_max_angle": 45.0,
    "data.trifeature_texture_angle": 360.0,
    "optim.schedule": "cosine",
    "optim.decay_epochs": (),
    "probe.features": "backbone",
    "probe.rotation": False,
    "ft.positive_interpolation": False,
}


class ConfigChangeError(UsageError):
  """A resume was asked with a config that differs from the run's."""


def _write_json(path: epath.Path, text: str) -> None:
  tmp = path.parent / (path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(path)


def save_start(config: ml_collections.ConfigDict, workdir: str, step: int) -> None:
  """Write workdir/config.json and workdir/config.step<step>.json (workdir may be a URL)."""
  root = epath.Path(workdir)
  root.mkdir(parents=True, exist_ok=True)
  text = config.to_json(indent=2)
  _write_json(root / f"config.step{step}.json", text)
  _write_json(root / "config.json", text)


def read(workdir: str) -> ml_collections.ConfigDict:
  """The config of the latest start of the run in `workdir`."""
  path = epath.Path(workdir) / "config.json"
  if not epath.Path(workdir).exists():
    raise UsageError(f"workdir {workdir} does not exist: give the folder of a pretraining run")
  if not path.exists():
    raise UsageError(f"{path} not found: {workdir} holds no cl_jax pretraining run")
  try:
    raw = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise UsageError(
        f"{path} is not valid JSON ({e.msg} at line {e.lineno}): the run's config is damaged; "
        f"restore it from a config.step<N>.json beside it"
    ) from None
  for block, field in _TUPLES:
    if field in raw.get(block, {}):
      raw[block][field] = tuple(raw[block][field])
  return ml_collections.ConfigDict(raw)


def flatten(config) -> dict:
  """{"block.field": value} of a (nested) config; lists become tuples."""
  out = {}
  for key, value in (config.items() if hasattr(config, "items") else ()):
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update({f"{key}.{k}": v for k, v in flatten(value).items()})
    else:
      out[key] = tuple(value) if isinstance(value, list) else value
  return out


def differences(stored, new) -> list[tuple[str, object, object]]:
  """(field, stored value, new value) for every field that differs; a field that one
  side lacks shows as "<absent>"."""
  a, b = flatten(stored), flatten(new)
  return [
      (k, a.get(k, ABSENT), b.get(k, ABSENT))
      for k in sorted(set(a) | set(b))
      if a.get(k, ABSENT) != b.get(k, ABSENT)
  ]


def changeable(field: str) -> bool:
  """Whether `field` may change when a run resumes (with --allow_config_change)."""
  return any(field == c or (c.endswith(".") and field.startswith(c)) for c in CHANGEABLE)


SHOWN_CHANGES = 3  # a refusal names this many changed fields, then counts the others


def _some(changes: list[str]) -> str:
  """The first SHOWN_CHANGES of `changes`, "; "-joined, and how many more there are."""
  shown = "; ".join(changes[:SHOWN_CHANGES])
  more = len(changes) - SHOWN_CHANGES
  return shown + (f" and {more} more field{'s' if more > 1 else ''}" if more > 0 else "")


def check_resume(stored, new, *, step: int, workdir: str, allow_change: bool) -> list[str]:
  """Raise ConfigChangeError unless config `new` may resume the run of config `stored`
  (its checkpoint at `step`), naming the first few changed fields and counting the others
  (config.json in the workdir holds them all); return the accepted changes as
  "field: old -> new" lines."""
  old_flat, new_flat = flatten(stored), flatten(new)

  def inert(field: str, old, new) -> bool:
    switch = field.split(".")[0] + ".enabled"
    if old_flat.get(switch, False) is False and new_flat.get(switch) is False:
      return True  # an add-on switched off in both (or missing from the stored config)
    if ABSENT in (old, new) and changeable(field):
      return True  # a field added or renamed since the run started that does not define a run
    return old == ABSENT and field in INERT and INERT[field] == new_flat.get(field)

  diffs = [(k, a, b) for k, a, b in differences(stored, new) if not inert(k, a, b)]
  fixed = [f"{k}: {a!r} -> {b!r}" for k, a, b in diffs if not changeable(k)]
  free = [f"{k}: {a!r} -> {b!r}" for k, a, b in diffs if changeable(k)]
  if fixed:
    allowed = (
        f" (the other changes, {_some(free)}, are allowed with --allow_config_change)"
        if free
        else ""
    )
    raise ConfigChangeError(
        f"{workdir} holds a run (checkpoint at step {step}) with another config: "
        f"{_some(fixed)}. These fields define the run: start a new run with another "
        f"--workdir, or resume this one with its own values{allowed}."
    )
  if free and not allow_change:
    raise ConfigChangeError(
        f"{workdir} holds a run (checkpoint at step {step}) started with other values of "
        f"{_some(free)}. Pass --allow_config_change to resume with the new values "
        "(each start's config is kept in config.step<N>.json), or drop the overrides."
    )
  return free


def suggest(field: str, config) -> str:
  """' (did you mean X?)' for the closest existing dotted field of `config`, or ''."""
  close = difflib.get_close_matches(field, list(flatten(config)), n=1)
  return f" (did you mean {close[0]}?)" if close else ""
