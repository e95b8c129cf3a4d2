"""A donated state kept in the device-local layouts its step's compiler chooses.

An array's device-local layout is the order in which its elements lie in a device's memory
(jax.experimental.layout). jax.jit gives every argument and result the default layout, row
major, unless told otherwise, and XLA must then read and write the state in that order. On
GPUs that costs the train step dearly: cuDNN reads a convolution's kernel as (C_out, kh, kw,
C_in) while Flax stores it as (kh, kw, C_in, C_out), so each step transposes every float32
kernel of the online network, the EMA target and the momentum, in fusions that XLA cannot
update in place and follows with copies into the donated buffers (docs/benchmarks.md counts
them in the ResNet-50 step compiled for one H100).

StepJit compiles a step f(state, *args) -> (state, out) with the state's layouts left to the
compiler (Layout.AUTO, the same for the state it returns, which reuses the donated buffers),
and its siblings (other steps of the same run, sharing one StateLayouts) for the layouts the
first one chose, so that every step reads the state as the previous one wrote it. A state
enters those layouts once (StateLayouts.place, on a step's first call); from then on each step
hands the next one its state as it wants it. The values do not change: a layout orders the
same elements differently in memory. The CPU's compiler keeps the default layouts.
"""

from typing import Any, Callable

import jax
from jax.experimental.layout import Format, Layout

__all__ = ["StateLayouts", "StepJit", "abstract"]


def abstract(tree):
  """tree with each array replaced by its jax.ShapeDtypeStruct (shape, dtype, sharding):
  what lowering for Layout.AUTO or for given layouts takes (a jax.Array brings its own
  layout, which would have to match)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree
  )


class StateLayouts:
  """The state's layouts shared by the steps of one run: None until the first step compiles,
  then its compiled program's state formats (a tree of Format, like the state)."""

  def __init__(self, formats=None):
    self.formats = formats
    self._identity = None

  def place(self, state):
    """`state` in self.formats (donated: each array whose layout changes is copied once into
    its new layout, the others are passed through)."""
    if self.formats is None or all(
        getattr(x, "format", None) == f
        for x, f in zip(jax.tree.leaves(state), jax.tree.leaves(self.formats))
    ):
      return state
    if self._identity is None:
      self._identity = jax.jit(lambda s: s, out_shardings=self.formats, donate_argnums=(0,))
    return self._identity(state)


class StepJit:
  """f(state, *args) -> (state, out) jitted over a mesh with the state donated and kept in the
  layouts of `layouts` (the compiler's choice when this is the first of its steps to compile).

  Call it as the jitted function; it compiles on its first call for the arguments' shapes (and
  again for arguments of other shapes) and places the state in the layouts it compiled for.
  lower and compile serve ahead-of-time use.

  Args:
    fn: the step.
    state_sharding: the state's shardings (a tree like the state).
    arg_shardings: the other arguments' shardings (a tuple, one per argument).
    out_sharding: the sharding of `out` (None: the compiler's, as for metrics).
    layouts: the StateLayouts shared with the other steps of the run (default: its own).
  """

  def __init__(
      self,
      fn: Callable,
      state_sharding,
      arg_shardings: tuple,
      out_sharding: Any = None,
      layouts: StateLayouts | None = None,
  ):
    self.fn, self.state_sharding, self.arg_shardings = fn, state_sharding, arg_shardings
    self.out_sharding = out_sharding
    self.layouts = StateLayouts() if layouts is None else layouts
    self._compiled = {}

  def jitted(self):
    """The jax.jit of fn: the state in and out in layouts.formats, or Layout.AUTO while
    those are not yet known."""
    state_in = self.layouts.formats
    if state_in is None:
      state_in = jax.tree.map(lambda s: Format(Layout.AUTO, s), self.state_sharding)
    return jax.jit(
        self.fn,
        in_shardings=(state_in, *self.arg_shardings),
        out_shardings=(state_in, self.out_sharding),
        donate_argnums=(0,),
    )

  def lower(self, state, *args) -> jax.stages.Lowered:
    """fn lowered for arguments like `state` and `args` (arrays or ShapeDtypeStructs)."""
    return self.jitted().lower(abstract(state), *abstract(args))

  def compile(self, state, *args) -> jax.stages.Compiled:
    """fn compiled for arguments like `state` and `args` (record). Call the result with a
    state in the layouts it compiled for (place)."""
    return self.record(self.lower(state, *args).compile())

  def record(self, compiled: jax.stages.Compiled) -> jax.stages.Compiled:
    """`compiled` (of lower(...).compile()); the first of the run's steps to compile fixes
    the state's layouts (layouts.formats) to its."""
    if self.layouts.formats is None:
      self.layouts.formats = compiled.input_formats[0][0]
    return compiled

  def place(self, state):
    """`state` in the layouts the steps compiled for (layouts.place)."""
    return self.layouts.place(state)

  def __call__(self, state, *args):
    key = (jax.tree.structure(args), tuple((x.shape, x.dtype) for x in jax.tree.leaves(args)))
    compiled = self._compiled.get(key)
    if compiled is None:
      compiled = self._compiled[key] = self.compile(state, *args)
      state = self.place(state)
    return compiled(state, *args)
