"""orbax checkpoints: the train state and the input iterator's position.

Saves are asynchronous and atomic (orbax writes to a temporary directory and
renames it when complete), so a run killed mid-save leaves the previous
checkpoint as the latest one.
"""
import os

import jax
import orbax.checkpoint as ocp


def make_manager(workdir: str, keep: int = 2, *, read_only: bool = False) -> ocp.CheckpointManager:
  """Manager of `workdir`/checkpoints keeping the `keep` most recent steps."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=not read_only,
                                         create=not read_only, read_only=read_only)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                               options=options, item_names=("state", "data"))


def save(manager: ocp.CheckpointManager, state, data_state: dict) -> None:
  """Start saving `state` and the JSON-able iterator state at state.step."""
  manager.save(int(state.step), args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))


def abstract(state):
  """Shape/dtype/sharding skeleton of `state` to restore into."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)


def restore(manager: ocp.CheckpointManager, template, step: int | None = None,
            with_data: bool = True):
  """(state, data_state) of `step` (default: the latest), or None if there is none.

  Args:
    template: a state (or its `abstract`) with the shapes, dtypes and
      shardings to restore into.
    with_data: also restore the iterator state (else data_state is None).
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  if step not in manager.all_steps():
    raise FileNotFoundError(f"no checkpoint at step {step} in {manager.directory}; "
                            f"available steps: {sorted(manager.all_steps())}")
  items = {"state": ocp.args.StandardRestore(abstract(template))}
  if with_data:
    items["data"] = ocp.args.JsonRestore()
  out = manager.restore(step, args=ocp.args.Composite(**items))
  return out["state"], (out["data"] if with_data else None)
