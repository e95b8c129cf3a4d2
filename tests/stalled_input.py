"""`python -m tests.stalled_input STEP ARGS...`: `python -m cl_jax.main ARGS` whose input stops
delivering, as a deadlocked input pipeline does: the batch of the STEP-th step this start takes
never arrives (the call that places it on the devices blocks for ever)."""

import runpy
import sys
import threading

from cl_jax.runtime import parallel


def main() -> None:
  stall_at = int(sys.argv.pop(1))
  place = parallel.global_batch
  calls = []

  def global_batch(local, mesh):
    calls.append(None)
    if len(calls) == stall_at:
      threading.Event().wait()  # never set
    return place(local, mesh)

  parallel.global_batch = global_batch
  runpy.run_module("cl_jax.main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
