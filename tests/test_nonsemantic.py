"""Tests for cl_jax.addons.nonsemantic (ns_logits, the patch images, NonSemantic) and the NS
terms NonSemantic.negatives adds to MoCo's cl_jax.objectives.moco.pair_loss (Ge et al. 2021).

Loss references are NumPy float64 loops over the queries written from the paper:
  L_in  (Eq. 1, App. B.1): den = exp(q.k/T) + sum_m exp(alpha q.t_m/T) + sum_j exp(q.n_j/T)
  L_out (App. B.1):        den = exp(q.k/T) + sum_m alpha exp(q.t_m/T) + sum_j exp(q.n_j/T)
with L = -1/B sum_i log(exp(q_i.k_i/T) / den_i), and the gradients of App. B.1.
Patch references rebuild each NS image from its layout, or check it without the layout on
views whose pixels encode their own (y, x) coordinates.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cl_jax.addons import nonsemantic
from cl_jax.addons.from_config import AddOns
from cl_jax.objectives import moco
from cl_jax.runtime import parallel

DIM, QUEUE = 8, 16


def _unit(rng, *shape):
  x = rng.normal(size=shape)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_ns_loss_and_grad(q, k, queue, t, temperature, alpha, mode):
  """L_in / L_out of App. B.1 averaged over queries, and dL/dq from the same appendix."""
  loss, grad = 0.0, np.zeros_like(q)
  for i, (qi, ki) in enumerate(zip(q, k)):
    e_pos = np.exp(qi @ ki / temperature)
    e_neg = np.exp(queue @ qi / temperature)  # (K,)
    if mode == "in":
      w_ns = np.exp(alpha * (t[i] @ qi) / temperature)  # (M,) terms of the denominator
      d_ns = alpha * w_ns  # their d/d(q.t / T)
    else:
      w_ns = alpha * np.exp(t[i] @ qi / temperature)
      d_ns = w_ns
    den = e_pos + w_ns.sum() + e_neg.sum()
    loss += -np.log(e_pos / den)
    grad[i] = (e_pos * ki + d_ns @ t[i] + e_neg @ queue) / (den * temperature) - ki / temperature
  return loss / len(q), grad / len(q)


def _inputs(seed, batch, num_ns):
  rng = np.random.default_rng(seed)
  return (
      _unit(rng, batch, DIM),
      _unit(rng, batch, DIM),
      _unit(rng, QUEUE, DIM),
      _unit(rng, batch, num_ns, DIM),
  )


@functools.partial(jax.jit, static_argnames=("temperature", "mode"))
def _jax_loss_and_grads(q, k, queue, t, temperature, alpha, mode):
  """pair_loss with NS keys t and no other add-on: (loss, stats, (dL/dq, dL/dt)); alpha is
  traced."""
  ns = nonsemantic.NonSemantic("patch", t.shape[1], alpha, mode, 3, 10)
  mesh = parallel.make_mesh(jax.devices()[:1])
  rng, step, batch = jax.random.key(0), jnp.asarray(0), q.shape[0]
  loss_fn = lambda qq, tt: moco.pair_loss(
      qq, k, queue, tt, AddOns(nonsemantic=ns), temperature, mesh, rng, step, batch
  )
  (loss, stats), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(q, t)
  return loss, stats, grads


def _f32(*arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


# ---------------------------------------------------------------- NS logits


def test_ns_logits_in_and_out_modes():
  sim = np.array([[0.3, -0.5], [0.9, 0.0], [-1.0, 1.0]])
  out_in = nonsemantic.ns_logits(jnp.asarray(sim, jnp.float32), 2.0, 0.2, "in")
  out_out = nonsemantic.ns_logits(jnp.asarray(sim, jnp.float32), 2.0, 0.2, "out")
  chex.assert_shape([out_in, out_out], (3, 2))
  assert out_in.dtype == out_out.dtype == jnp.float32
  np.testing.assert_allclose(out_in, 2.0 * sim / 0.2, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out_out, sim / 0.2 + np.log(2.0), rtol=1e-6, atol=1e-6)
  # Hand-checked: s = 0.3, alpha = 2, T = 0.2 -> in: 3.0, out: 1.5 + 0.6931...
  np.testing.assert_allclose([out_in[0, 0], out_out[0, 0]], [3.0, 1.5 + 0.693147], rtol=1e-5)


@pytest.mark.parametrize("mode", ["", "IN", "inside", None])
def test_ns_logits_bad_mode_raises(mode):
  with pytest.raises(ValueError, match="alpha_mode"):
    nonsemantic.ns_logits(jnp.zeros((2, 1)), 2.0, 0.2, mode)


def test_pair_loss_bad_mode_raises():
  q, k, queue, t = _f32(*_inputs(0, 5, 1))
  with pytest.raises(ValueError, match="alpha_mode"):
    _jax_loss_and_grads(q, k, queue, t, 0.2, 2.0, "both")


# ---------------------------------------------------------------- pair_loss with NS keys


def test_numpy_ns_gradient_matches_finite_differences():
  # Validates the reference App. B.1 gradients themselves, in float64.
  q, k, queue, t = _inputs(1, 5, 2)
  for mode in ("in", "out"):
    _, analytic = _np_ns_loss_and_grad(q, k, queue, t, 0.2, 2.5, mode)
    numeric = np.zeros_like(q)
    for idx in np.ndindex(q.shape):
      dq = np.zeros_like(q)
      dq[idx] = 1e-6
      hi, _ = _np_ns_loss_and_grad(q + dq, k, queue, t, 0.2, 2.5, mode)
      lo, _ = _np_ns_loss_and_grad(q - dq, k, queue, t, 0.2, 2.5, mode)
      numeric[idx] = (hi - lo) / 2e-6
    np.testing.assert_allclose(analytic, numeric, atol=1e-7)


@pytest.mark.parametrize("mode", ["in", "out"])
@pytest.mark.parametrize("num_ns", [1, 2])
@pytest.mark.parametrize("alpha", [0.5, 2.0, 3.0])
def test_pair_loss_with_ns_matches_paper(mode, num_ns, alpha):
  batch, temperature = 5, 0.2
  q, k, queue, t = _inputs(num_ns * 10 + int(alpha * 2), batch, num_ns)
  want_loss, want_grad = _np_ns_loss_and_grad(q, k, queue, t, temperature, alpha, mode)
  qj, kj, queuej, tj = _f32(q, k, queue, t)
  loss, _, (grad, _) = _jax_loss_and_grads(qj, kj, queuej, tj, temperature, alpha, mode)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  chex.assert_shape(grad, (batch, DIM))
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)


def test_in_and_out_differ_unless_alpha_is_one():
  q, k, queue, t = _inputs(3, 5, 1)
  args = _f32(q, k, queue, t)
  l_in = _jax_loss_and_grads(*args, 0.2, 2.0, "in")[0]
  l_out = _jax_loss_and_grads(*args, 0.2, 2.0, "out")[0]
  assert abs(float(l_in) - float(l_out)) > 1e-3
  np.testing.assert_allclose(
      l_in, _np_ns_loss_and_grad(q, k, queue, t, 0.2, 2.0, "in")[0], rtol=1e-5
  )


@pytest.mark.parametrize("num_ns", [1, 2])
def test_out_mode_alpha_one_equals_plain_extra_negatives(num_ns):
  # alpha = 1 in L_out: each t_im is one more negative of query i only.
  q, k, queue, t = _inputs(4, 5, num_ns)
  want = 0.0
  for qi, ki, ti in zip(q, k, t):
    negs = np.concatenate([queue, ti])
    e_pos = np.exp(qi @ ki / 0.2)
    want += -np.log(e_pos / (e_pos + np.exp(negs @ qi / 0.2).sum()))
  want /= len(q)
  loss, _, _ = _jax_loss_and_grads(*_f32(q, k, queue, t), 0.2, 1.0, "out")
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  # In L_in alpha = 1 is the same contrast.
  loss_in, _, _ = _jax_loss_and_grads(*_f32(q, k, queue, t), 0.2, 1.0, "in")
  np.testing.assert_allclose(loss_in, want, rtol=1e-5)


@pytest.mark.parametrize("mode", ["in", "out"])
def test_no_gradient_into_ns_keys(mode):
  q, k, queue, t = _f32(*_inputs(5, 5, 2))
  _, _, (g_q, g_t) = _jax_loss_and_grads(q, k, queue, t, 0.2, 2.0, mode)
  assert np.abs(g_q).max() > 1e-3  # the loss does depend on q
  np.testing.assert_array_equal(g_t, np.zeros_like(t))


def test_ns_score_statistics_match_numpy():
  q, k, queue, t = _inputs(6, 5, 2)
  _, stats, _ = _jax_loss_and_grads(*_f32(q, k, queue, t), 0.2, 2.0, "in")
  assert set(stats) == {"pos_mean", "neg_mean", "neg_var", "ns_mean"}
  ns = [qi @ tim for qi, ti in zip(q, t) for tim in ti]
  np.testing.assert_allclose(stats["ns_mean"], np.mean(ns), rtol=1e-5, atol=1e-6)
  # The NS keys are not negatives of the queue statistics.
  np.testing.assert_allclose(stats["neg_mean"], np.mean(q @ queue.T), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- patch layout and rendering


def _coordinate_views(batch, size):
  """(B, S, S, 3) int32 views whose pixel (b, y, x) holds (y, x, b)."""
  yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
  views = np.stack(
      [
          np.broadcast_to(yy, (batch, size, size)),
          np.broadcast_to(xx, (batch, size, size)),
          np.broadcast_to(np.arange(batch)[:, None, None], (batch, size, size)),
      ],
      -1,
  )
  return views.astype(np.int32)


def _np_render(view, d, corners):
  """Tile the d x d crops at corners[i, j] of view (S, S, C); crop the canvas to S x S."""
  s = view.shape[0]
  out = np.full(view.shape, np.nan)
  cells = -(-s // d)  # ceil(S / d) per side
  for i in range(cells):
    for j in range(cells):
      y0, x0 = i * d, j * d
      h, w = min(d, s - y0), min(d, s - x0)
      cy, cx = corners[i, j]
      assert 0 <= cy <= s - d and 0 <= cx <= s - d
      out[y0 : y0 + h, x0 : x0 + w] = view[cy : cy + h, cx : cx + w]
  assert not np.isnan(out).any()
  return out


def _tiling_corners(image, d):
  """Crop corners (n, n, 2) of a coordinate-encoded NS image tiled with d x d cells.

  Returns None unless every cell (full or clipped at the border) shows consecutive source
  coordinates starting at a corner (cy, cx) with 0 <= cy, cx <= S - d.
  """
  s = image.shape[0]
  cells = -(-s // d)
  corners = np.zeros((cells, cells, 2), np.int64)
  for i in range(cells):
    for j in range(cells):
      block = image[i * d : (i + 1) * d, j * d : (j + 1) * d]
      cy, cx = block[0, 0, 0], block[0, 0, 1]
      h, w = block.shape[:2]
      if not (0 <= cy <= s - d and 0 <= cx <= s - d):
        return None
      if not (
          np.array_equal(block[..., 0], np.broadcast_to(cy + np.arange(h)[:, None], (h, w)))
          and np.array_equal(block[..., 1], np.broadcast_to(cx + np.arange(w)[None, :], (h, w)))
      ):
        return None
      corners[i, j] = cy, cx
  return corners


# One compilation per (shape, d_min, d_max); the fixtures below share them across tests.
_patch_negatives = jax.jit(nonsemantic.patch_negatives, static_argnums=(2, 3, 4))
_sample_layout = jax.jit(nonsemantic.sample_patch_layout, static_argnums=(1, 2, 3, 4))
_render = jax.jit(nonsemantic.render_patches, static_argnums=2)


@pytest.fixture(scope="module")
def ranged():
  """NS images of coordinate views, B = 4, M = 5, S = 12, d in [3, 7], for two keys."""
  views = jnp.asarray(_coordinate_views(4, 12))
  return [np.asarray(_patch_negatives(jax.random.key(seed), views, 5, 3, 7)) for seed in (0, 1)]


@pytest.fixture(scope="module")
def fixed4():
  """NS images of coordinate views, B = 250, M = 4, S = 9, d = 4 (last cells clipped to 1)."""
  views = jnp.asarray(_coordinate_views(250, 9))
  return np.asarray(_patch_negatives(jax.random.key(2), views, 4, 4, 4))


@pytest.fixture(scope="module")
def layout16():
  """3000 layouts for S = 16, d in [1, 16]."""
  layout = _sample_layout(jax.random.key(3), 3000, 16, 1, 16)
  return {name: np.asarray(v) for name, v in layout.items()}


def test_patch_negatives_shape_and_own_view(ranged):
  out = ranged[0]
  chex.assert_shape(out, (4, 5, 12, 12, 3))
  assert out.dtype == np.int32
  for b in range(4):
    np.testing.assert_array_equal(out[b, ..., 2], b)  # built from its own view


def test_layout_sizes_cover_inclusive_range_uniformly(layout16):
  size = layout16["size"]
  chex.assert_shape(size, (3000,))
  assert size.dtype == np.int32
  assert size.min() == 1 and size.max() == 16
  counts = np.bincount(size, minlength=17)[1:]
  assert counts.min() > 130 and counts.max() < 250  # expected 187.5 each


def test_layout_corners_within_bounds_and_cover_range(layout16):
  s = 16
  size, corner = layout16["size"], layout16["corner"]
  chex.assert_shape(corner, (3000, s + 1, s + 1, 2))  # G = S // d_min + 1
  assert corner.dtype == np.int32
  assert corner.min() >= 0
  assert np.all(corner <= (s - size)[:, None, None, None])
  for d in range(1, s + 1):
    used = corner[size == d, : -(-s // d), : -(-s // d)]
    for axis in (0, 1):
      values = np.unique(used[..., axis])
      np.testing.assert_array_equal(values, np.arange(s - d + 1))  # both ends reached


def test_render_matches_numpy_reconstruction_from_layout(layout16):
  # The first 40 images plus the first with d = 1 and with d = S.
  idx = np.concatenate(
      [np.arange(40), [np.argmax(layout16["size"] == 1)], [np.argmax(layout16["size"] == 16)]]
  )
  layout = {name: v[idx] for name, v in layout16.items()}
  assert {1, 16} <= set(layout["size"].tolist())
  views = np.random.default_rng(0).integers(0, 256, (len(idx), 16, 16, 3)).astype(np.uint8)
  out = np.asarray(_render(jnp.asarray(views), layout, 16))
  chex.assert_shape(out, views.shape)
  assert out.dtype == np.uint8
  for b in range(len(idx)):
    np.testing.assert_array_equal(
        out[b], _np_render(views[b], layout["size"][b], layout["corner"][b])
    )


@pytest.mark.parametrize(
    "dtype,s,d_min,d_max",
    [
        (np.uint8, 16, 1, 16),
        (np.float32, 12, 3, 7),
        (jnp.bfloat16, 9, 4, 4),
        (np.float32, 20, 2, 5),
    ],
)
def test_tpu_form_equals_the_numpy_reconstruction(dtype, s, d_min, d_max):
  """The TPU form (a gather of row segments and a one-hot product) gives every NS image of
  the NumPy reconstruction exactly, at patch sizes from 1 to S, clipped border cells
  (S = 9, d = 4) and float values that a rounded product would change."""
  n = 24
  layout = _sample_layout(jax.random.key(s), n, s, d_min, d_max)
  layout = {name: np.asarray(v) for name, v in layout.items()}
  rng = np.random.default_rng(s)
  views = rng.integers(0, 256, (n, s, s, 3)) if dtype == np.uint8 else rng.normal(size=(n, s, s, 3))
  views = jnp.asarray(views, dtype)
  render = jax.jit(nonsemantic._render_segments, static_argnums=3)  # pylint: disable=protected-access
  out = np.asarray(render(views, layout["size"], layout["corner"], d_max).astype(jnp.float32))
  assert out.shape == views.shape
  reference = np.asarray(views.astype(jnp.float32))
  for b in range(n):
    np.testing.assert_array_equal(
        out[b], _np_render(reference[b], layout["size"][b], layout["corner"][b])
    )


def test_render_gathers_pixels_off_tpus_and_row_segments_on_tpus():
  """Lowered for each platform (no TPU or GPU needed): one gather of single pixels elsewhere;
  on TPUs a gather of d_max-wide row segments and the one-hot products that place them
  (test_tpu_form_equals_the_numpy_reconstruction checks that the forms agree)."""
  views = jax.ShapeDtypeStruct((2, 12, 12, 3), jnp.bfloat16)
  layout = {
      "size": jax.ShapeDtypeStruct((2,), jnp.int32),
      "corner": jax.ShapeDtypeStruct((2, 5, 5, 2), jnp.int32),
  }
  render = jax.jit(nonsemantic.render_patches, static_argnums=2)
  tpu = render.trace(views, layout, 7).lower(lowering_platforms=("tpu",)).as_text()
  cuda = render.trace(views, layout, 7).lower(lowering_platforms=("cuda",)).as_text()
  assert tpu.count("slice_sizes = array<i64: 1, 1, 7>") == 3 and tpu.count("dot_general") == 3
  assert "slice_sizes = array<i64: 1, 1, 3>" not in tpu
  assert "dot_general" not in cuda and "slice_sizes = array<i64: 1, 1, 3>" in cuda


def test_fixed_size_cells_are_contiguous_blocks_of_own_view(fixed4):
  # S = 9, d = 4: 3 x 3 cells, the last row and column clipped to one pixel.
  for b in (0, 1, 249):
    np.testing.assert_array_equal(fixed4[b, ..., 2], b)
  for image in fixed4.reshape((-1,) + fixed4.shape[2:]):
    assert _tiling_corners(image, 4) is not None


def test_ranged_size_cells_are_contiguous_blocks_for_some_sampled_size(ranged):
  for image in ranged[0].reshape((-1,) + ranged[0].shape[2:]):
    assert any(_tiling_corners(image, d) is not None for d in range(3, 8))


def test_tiling_check_rejects_a_wrong_patch_size(fixed4):
  # The layout-free check is not vacuous: a 4-tiling is not in general a 3-tiling.
  assert any(_tiling_corners(image, 3) is None for image in fixed4[0])


def test_patch_size_equal_to_view_size_gives_the_view():
  views = np.random.default_rng(5).uniform(0, 1, (2, 10, 10, 3)).astype(np.float32)
  out = np.asarray(_patch_negatives(jax.random.key(6), jnp.asarray(views), 3, 10, 10))
  chex.assert_shape(out, (2, 3, 10, 10, 3))
  assert out.dtype == np.float32
  for m in range(3):
    np.testing.assert_array_equal(out[:, m], views)


def test_different_rng_gives_different_images(ranged):
  a, b = ranged
  assert not np.array_equal(a, b)
  assert not np.array_equal(a[:, 0], a[:, 1])  # the M images of a view differ


def test_cells_are_sampled_independently_with_replacement(fixed4):
  # S = 9, d = 4: 3 x 3 cells, each corner uniform over 6 x 6 = 36 positions. Independent
  # sampling with replacement makes any two cells coincide with probability 1/36; a shuffle
  # of non-overlapping locations never would.
  images = fixed4.reshape((-1,) + fixed4.shape[2:])
  corners = np.stack([_tiling_corners(image, 4) for image in images])  # (1000, 3, 3, 2)
  flat = corners.reshape(len(corners), 9, 2)
  pairs = [(a, b) for a in range(9) for b in range(a + 1, 9)]
  same = sum(np.all(flat[:, a] == flat[:, b], axis=1).sum() for a, b in pairs)
  # 36 pairs x 1000 images: expected 1000 coincidences, standard deviation ~31.
  assert 850 < same < 1150
  for cell in range(9):
    for axis in (0, 1):
      counts = np.bincount(flat[:, cell, axis], minlength=6)
      assert counts.shape == (6,) and counts.min() > 110 and counts.max() < 225  # 167 each


@pytest.mark.parametrize("d_min,d_max", [(5, 9), (5, 3), (0, 4)])
def test_patch_negatives_rejects_patch_sizes_outside_one_to_view_size(d_min, d_max):
  # 1 <= d_min <= d_max <= S (docstring of patch_negatives); with S = 6, d_max = 9 would need
  # crops larger than the view and d_min > d_max an empty range.
  with pytest.raises(ValueError):
    nonsemantic.patch_negatives(jax.random.key(0), jnp.zeros((2, 6, 6, 1)), 1, d_min, d_max)


def test_texture_negatives_need_the_views_texture_images():
  ns = nonsemantic.NonSemantic("texture", 1, 2.0, "in", 3, 10)
  views = jnp.zeros((2, 8, 8, 3))
  with pytest.raises(ValueError, match="needs the views' texture images"):
    ns.images(jax.random.key(0), views, None)
  texture = jnp.ones((2, 8, 8, 3))
  np.testing.assert_array_equal(ns.images(jax.random.key(0), views, texture), texture[:, None])
