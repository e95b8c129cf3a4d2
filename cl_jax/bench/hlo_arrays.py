"""Arrays in XLA's HLO text: their dtypes, shapes and bytes, for the compile report
(cl_jax.bench.compile) and the step profile (cl_jax.bench.profile).

Hand-written because jax exposes a compiled module only as text (compiled.as_text()); the
printed form is XLA's: an array type is dtype[d0,d1,...]{layout}, a tuple type lists them in
parentheses, a scalar has no dimensions (f32[]).
"""

import math
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}
DTYPE_BYTES.update({"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8})
SHAPE = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([\d,]*)\]")


def elements(dims: str) -> int:
  """Elements of an array of dims "d0,d1,..." ("" for a scalar)."""
  return math.prod(int(d) for d in dims.split(",") if d)


def arrays_bytes(arrays: list[tuple[str, str]]) -> int:
  """Bytes of (dtype, "d0,d1,...") arrays, as SHAPE.findall gives them."""
  return sum(DTYPE_BYTES[dtype] * elements(dims) for dtype, dims in arrays)


def type_bytes(type_text: str, first_only: bool = False) -> int:
  """Bytes of the arrays of an HLO type ("f32[8,4]{1,0}" or a tuple of them); first_only: of
  its first array alone."""
  arrays = SHAPE.findall(type_text)
  return arrays_bytes(arrays[:1] if first_only else arrays)
