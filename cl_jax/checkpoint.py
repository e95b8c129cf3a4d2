"""orbax checkpoints: the train state, the input iterator's position and the queue layout.

Saves are asynchronous and atomic (orbax writes to a temporary directory and
renames it when complete), so a run killed mid-save leaves the previous
checkpoint as the latest one. Every process takes part: each writes the array
shards it owns and its own iterator position (grain's checkpoint handler, one
file per process); `meta` (written once) records the queue layout, so a run can
resume on a different number of devices.
"""
import os

import grain
from etils import epath
import orbax.checkpoint as ocp


def make_manager(workdir: str, keep: int = 2, *, read_only: bool = False) -> ocp.CheckpointManager:
  """Manager of `workdir`/checkpoints keeping the `keep` most recent steps.

  `workdir` may be a local path or a gs:// URL.
  """
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=not read_only,
                                         create=not read_only, read_only=read_only)
  root = str(workdir)
  directory = epath.Path(root if "://" in root else os.path.abspath(root)) / "checkpoints"
  return ocp.CheckpointManager(directory, options=options, item_names=("state", "data", "meta"))


def save(manager: ocp.CheckpointManager, state, data_iterator, meta: dict) -> None:
  """Start saving `state`, the iterator's position and the JSON-able `meta` at state.step."""
  manager.save(int(state.step), args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iterator),
      meta=ocp.args.JsonSave(meta)))


def restore(manager: ocp.CheckpointManager, template, step: int | None = None,
            data_iterator=None):
  """(state, meta) of `step` (default: the latest), or None if there is none.

  Args:
    template: the state's abstract shape (jax.eval_shape of its constructor)
      with the shardings to restore into.
    data_iterator: a grain iterator to move to the saved position (in place),
      or None to leave the input position alone (e.g. for a probe).
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  if step not in manager.all_steps():
    raise FileNotFoundError(f"no checkpoint at step {step} in {manager.directory}; "
                            f"available steps: {sorted(manager.all_steps())}")
  items = {"state": ocp.args.StandardRestore(template), "meta": ocp.args.JsonRestore()}
  if data_iterator is not None:
    items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
  out = manager.restore(step, args=ocp.args.Composite(**items))
  return out["state"], out["meta"]
