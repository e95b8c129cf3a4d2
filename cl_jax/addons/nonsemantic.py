"""Non-semantic negatives (Ge et al. 2021, Sec. 2.1, 2.3, App. B.1).

A non-semantic (NS) image keeps the local statistics of the query view but not
its global layout. Its key-encoder feature t enters the query's contrast as one
extra negative logit per NS image, scaled by alpha (NonSemantic.negatives).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections

from cl_jax.addons.addon import record
from cl_jax.losses import byol
from cl_jax.losses.contrast import Contrast, with_extra
from cl_jax.losses.queue_contrast import SCORE_PRECISION
from cl_jax.runtime.config_fields import choice, fail, get, integer, number

# Its entry's members (cl_jax.addons).
BLOCK = "nonsemantic"
TITLE = "non-semantic negatives"
NEEDS = (
    "its images are negatives of a contrast (Ge et al. 2021, Eq. 1) or pushed from in a "
    "target regression (Eq. 2)"
)
VARIANT = "kind"

ALPHA_MODES = ("in", "out")
KINDS = ("patch", "texture")


def ns_logits(sim: jax.Array, alpha: float, temperature: float, mode: str) -> jax.Array:
  """Logits of the non-semantic negatives from their similarities s = q . t.

  mode "in"  (L_in, Eq. 1 and App. B.1):  alpha * s / T
  mode "out" (L_out, App. B.1):           s / T + log(alpha),
      i.e. alpha * exp(s / T) inside the denominator.

  Args:
    sim: (B, M) similarities of each l2-normalised query with its M NS keys.
    alpha: > 0, the NS penalty.
    temperature: T > 0.
    mode: "in" or "out".

  Returns:
    (B, M) float32 logits, to be appended to the query's negative logits.
  """
  sim = sim.astype(jnp.float32)
  if mode == "in":
    return alpha * sim / temperature
  if mode == "out":
    return sim / temperature + jnp.log(alpha)
  raise ValueError(f"nonsemantic.alpha_mode must be one of {ALPHA_MODES}, got {mode!r}")


def sample_patch_layout(
    rng: jax.Array, batch: int, image_size: int, d_min: int, d_max: int
) -> dict[str, jax.Array]:
  """Random parameters of B patch-based NS images (Sec. 2.3).

  One integer patch size d ~ U{d_min..d_max} per image, and for each of the
  ceil-grid cells (image_size // d + 1)^2 an independent top-left corner
  (y, x) ~ U{0..image_size - d} of a d x d crop of the query view (sampling with
  replacement: crops may overlap and repeat). The grid is laid out for the
  largest possible cell count, (image_size // d_min + 1)^2; cells beyond the
  canvas of a larger d are never read.

  Returns:
    dict with "size": (B,) int32 patch sizes and "corner": (B, G, G, 2) int32
    crop corners, G = image_size // d_min + 1.
  """
  grid = image_size // d_min + 1
  r_size, r_corner = jax.random.split(rng)
  size = jax.random.randint(r_size, (batch,), d_min, d_max + 1, dtype=jnp.int32)
  u = jax.random.uniform(r_corner, (batch, grid, grid, 2))
  span = (image_size - size + 1).astype(jnp.float32)[:, None, None, None]
  corner = jnp.minimum(jnp.floor(u * span), span - 1).astype(jnp.int32)
  return {"size": size, "corner": corner}


def render_patches(views: jax.Array, layout: dict[str, jax.Array], d_max: int) -> jax.Array:
  """Tile the sampled d x d crops of each view and crop the canvas to S x S.

  Output pixel (y, x) of image b lies in cell (y // d, x // d) at offset (y % d, x % d), so it
  copies view[b, cy + y % d, cx + x % d] where (cy, cx) is that cell's crop corner. Two exact
  forms of it, picked by the platform the step is lowered for (jax.lax.platform_dependent):
  a gather of one index per pixel (_render_pixels) off TPUs, and on TPUs a gather of one
  index per row segment of a cell followed by a one-hot product that places the segments
  (_render_segments), since a TPU gather reads a whole (8, 128) tile per index: for 128 views of
  224 px and d in [16, 72] XLA's TPU compiler counts 283 GB of memory traffic for the first
  form and 2.4 GB for the second. Both are written per image (vmap over the batch), so that XLA
  sees each image read only its own pixels and keeps it on the device that holds the image,
  instead of gathering the whole batch onto every device.

  Args:
    views: (B, S, S, C) augmented query views.
    layout: output of sample_patch_layout for the same B and S.
    d_max: the largest patch size the layout can hold (its sample_patch_layout's d_max).

  Returns:
    (B, S, S, C) NS images, same dtype as views.
  """
  return jax.lax.platform_dependent(
      views,
      layout["size"],
      layout["corner"],
      tpu=functools.partial(_render_segments, d_max=d_max),
      default=_render_pixels,
  )


def _render_pixels(views: jax.Array, size: jax.Array, corner: jax.Array) -> jax.Array:
  """render_patches as one gather of a pixel per output pixel. Its indices are flat (one
  integer per pixel into the image's S*S pixels), not (S, S, 2) rows and columns, whose last
  axis a TPU would pad to 128."""
  s = views.shape[1]
  pos = jnp.arange(s, dtype=jnp.int32)
  yy, xx = pos[:, None], pos[None, :]  # (S, 1), (1, S)

  def one(view, d, corners):  # (S, S, C), (), (G, G, 2)
    cell = (yy // d) * corners.shape[1] + xx // d  # (S, S) flat cell index
    cy, cx = (corners[..., k].reshape(-1)[cell] for k in (0, 1))  # (S, S) each
    pixel = (cy + yy % d) * s + (cx + xx % d)
    return view.reshape(s * s, -1)[pixel]

  return jax.vmap(one)(views, size, corner)


def _render_segments(views: jax.Array, size: jax.Array, corner: jax.Array, d_max: int) -> jax.Array:
  """render_patches as, per image and channel, a gather of the d_max pixels from each cell's
  crop corner on each of its rows, W (S, G * d_max) with W[y, gx * d_max + j] =
  view[cy + y % d, cx + j] for the cell (y // d, gx), and a product W Q with the one-hot
  Q (G * d_max, S), Q[gx * d_max + j, x] = [x == gx * d + j][j < d], which keeps the first d
  pixels of each segment and places them at the cell's columns. Each output is one product
  of a value and 1 (at HIGHEST precision on TPUs): the same values as _render_pixels. The
  planes are padded with d_max columns on the right, so that no segment leaves its plane."""
  s, c = views.shape[1], views.shape[3]
  grid = corner.shape[1]
  pos = jnp.arange(s, dtype=jnp.int32)
  k = jnp.arange(grid * d_max, dtype=jnp.int32)
  segment, j = k // d_max, k % d_max
  dims = jax.lax.GatherDimensionNumbers(
      offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1)
  )

  def one(view, d, corners):  # (S, S, C), (), (G, G, 2)
    row_cells = corners[pos // d]  # (S, G, 2): the cells of each output row
    starts = jnp.stack([row_cells[..., 0] + (pos % d)[:, None], row_cells[..., 1]], axis=-1)
    placed = (pos[None, :] == segment[:, None] * d + j[:, None]) & (j[:, None] < d)
    planes = []
    for channel in range(c):
      plane = jnp.pad(view[..., channel], ((0, 0), (0, d_max)))  # (S, S + d_max)
      w = jax.lax.gather(
          plane, starts.reshape(-1, 2), dims, (1, d_max), mode="promise_in_bounds"
      ).reshape(s, grid * d_max)
      planes.append(jnp.dot(w, placed.astype(view.dtype), precision=jax.lax.Precision.HIGHEST))
    return jnp.stack(planes, axis=-1)

  return jax.vmap(one)(views, size, corner)


def patch_negatives(
    rng: jax.Array, views: jax.Array, num_ns: int, d_min: int, d_max: int
) -> jax.Array:
  """num_ns patch-based NS images per query view.

  Args:
    rng: PRNG key.
    views: (B, S, S, C) augmented query views.
    num_ns: M, NS images per view.
    d_min, d_max: inclusive range of the patch size, 1 <= d_min <= d_max <= S.

  Returns:
    (B, M, S, S, C) NS images.
  """
  bsz, s = views.shape[0], views.shape[1]
  if not 1 <= d_min <= d_max <= s:
    raise ValueError(
        f"patch sizes must satisfy 1 <= d_min <= d_max <= view size; got "
        f"d_min={d_min}, d_max={d_max}, view size {s}"
    )
  layout = sample_patch_layout(rng, bsz * num_ns, s, d_min, d_max)
  src = jnp.repeat(views, num_ns, axis=0)
  return render_patches(src, layout, d_max).reshape((bsz, num_ns) + views.shape[1:])


@dataclasses.dataclass(frozen=True)
class NonSemantic:
  """The non-semantic negatives of a run (the `nonsemantic` config block).

  kind: "patch" (Sec. 2.3, built from each view) or "texture" (Sec. 2.2, given).
  num_ns: M, NS images per view ("texture": 1).
  alpha, alpha_mode: the logit of an NS negative, ns_logits.
  patch_min, patch_max: the patch sizes of patch_negatives.
  """

  kind: str
  num_ns: int
  alpha: float
  alpha_mode: str
  patch_min: int
  patch_max: int

  def images(self, rng: jax.Array, views: jax.Array, texture: jax.Array | None) -> jax.Array:
    """(B, M, S, S, 3) NS images of (B, S, S, 3) views: patch images drawn with rng, or the
    views' texture images (B, S, S, 3) under the views' own augmentation ("texture")."""
    if self.kind == "texture":
      if texture is None:
        raise ValueError("nonsemantic.kind 'texture' needs the views' texture images")
      return texture[:, None]
    return patch_negatives(rng, views, self.num_ns, self.patch_min, self.patch_max)

  def negatives(
      self, contrast: Contrast, anchors: jax.Array, t: jax.Array, temperature: float
  ) -> Contrast:
    """The contrast with each anchor's NS negatives appended (Eq. 1).

    Args:
      contrast: the contrast of N anchors.
      anchors: (N, d) the anchors its similarities come from (after any transform).
      t: (N, M, d) unit NS features of each anchor's own view; no gradient flows into them.
      temperature: T of the contrast.

    Returns:
      contrast with an Extra block r_im = anchor_i . t_im, logits ns_logits(r), stat ns_mean.
    """
    n, d = anchors.shape
    if t.ndim != 3 or t.shape[0] != n or t.shape[2] != d:
      raise ValueError(
          f"NS features must be (N, M, d) = ({n}, M, {d}), one row per anchor; got {t.shape}"
      )
    sim = jnp.einsum(
        "nd,nmd->nm",
        anchors,
        jax.lax.stop_gradient(t).astype(jnp.float32),
        precision=SCORE_PRECISION,
    )
    logits = lambda r: ns_logits(r, self.alpha, temperature, self.alpha_mode)
    return with_extra(contrast, sim, logits, "ns_mean")

  def regression_loss(
      self, p: jax.Array, z: jax.Array, t: jax.Array, stop_gradient: bool, anchor: jax.Array
  ) -> tuple[jax.Array, dict]:
    """A regression method's loss of one view order with the NS penalty (Eq. 2,
    cl_jax.losses.byol.byol_ns_loss at this alpha); alpha_mode "out" belongs to InfoNCE's
    logits and has no meaning here (the config check refuses it)."""
    if self.alpha_mode != "in":
      raise ValueError("nonsemantic.alpha_mode 'out' is for InfoNCE's logits; Eq. 2 takes 'in'")
    return byol.byol_ns_loss(p, z, t, self.alpha, stop_gradient=stop_gradient, anchor=anchor)


def defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  del config
  block = ml_collections.ConfigDict()
  block.enabled = False
  block.kind = "patch"  # patch (Sec. 2.3) | texture (Sec. 2.2, needs data.texture_dir)
  block.num_ns = 1
  block.alpha = 2.0
  block.alpha_mode = "in"  # in: alpha * q.t / T (L_in); out: + log(alpha) (L_out)
  block.patch_min = 3
  block.patch_max = 10
  return block


def check(c, method, reads_data: bool) -> None:
  """Patch or texture images; reads_data=False skips the texture dataset's location."""
  kind = choice(c, "nonsemantic.kind", KINDS)
  num_ns = integer(c, "nonsemantic.num_ns", 1, 64)
  if kind == "texture" and num_ns != 1:
    fail("nonsemantic.num_ns", num_ns, "texture negatives are one image per view; set 1")
  if reads_data and kind == "texture" and not get(c, "data.texture_dir"):
    fail(
        "data.texture_dir",
        "",
        "texture negatives read the texture version of every image: make it with "
        "python -m cl_jax.data.make_texture and set data.texture_dir to its --out",
    )
  number(c, "nonsemantic.alpha", 0.0, None, lo_open=True)
  mode = choice(c, "nonsemantic.alpha_mode", ALPHA_MODES)
  if method.negatives is None and mode != "in":
    fail(
        "nonsemantic.alpha_mode",
        mode,
        f"'out' scales InfoNCE's logits; method {method.name!r} regresses without them "
        "(Ge et al. 2021, Eq. 2 weights the distance by alpha): set 'in'",
    )
  d_min = integer(c, "nonsemantic.patch_min", 1)
  d_max = integer(c, "nonsemantic.patch_max", 1)
  size = get(c, "data.image_size")
  if d_max > size:
    fail(
        "nonsemantic.patch_max",
        d_max,
        f"the patch size must not exceed the view size data.image_size = {size}",
    )
  if d_min > d_max:
    fail("nonsemantic.patch_min", d_min, f"must be <= nonsemantic.patch_max = {d_max}")


def describe(c) -> str:
  ns = c.nonsemantic
  source = (
      f"patch {ns.patch_min}-{ns.patch_max} px"
      if ns.kind == "patch"
      else f"from {c.data.texture_dir}"
  )
  return (
      f"non-semantic negatives ({ns.kind}, {ns.num_ns} per query, alpha {ns.alpha} "
      f"{ns.alpha_mode}, {source})"
  )


def build(c, steps_per_epoch: int):
  return record(NonSemantic, c.nonsemantic)
