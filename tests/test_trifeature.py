"""Tests for the procedural Trifeature dataset (cl_jax.data.trifeature)."""

import os

import numpy as np
import pytest

from cl_jax.data import trifeature

# Factor tables of the Trifeature dataset (Hermann & Lampinen 2020).
EXPECTED_SHAPES = tuple(
    "triangle square plus circle tee rhombus pentagon star fivesquare trapezoid".split()
)
EXPECTED_TEXTURES = tuple(
    "solid stripes grid hexgrid dots noise triangles zigzags rain pluses".split()
)
EXPECTED_COLOURS = {
    "red": (1, 0, 0),
    "green": (0, 1, 0),
    "blue": (0, 0, 1),
    "yellow": (1, 1, 0),
    "pink": (1, 0.4, 1),
    "cyan": (0, 1, 1),
    "purple": (0.3, 0, 0.5),
    "ocean": (0.1, 0.4, 0.5),
    "orange": (1, 0.6, 0),
    "white": (1, 1, 1),
}
REFERENCE_RGB_255 = np.array(list(EXPECTED_COLOURS.values())) * 255.0
SOLID = EXPECTED_TEXTURES.index("solid")
S = 32


def _is_grey(image):
  """(H, W) bool: pixel is the 0.5 grey background (uint8 127 or 128 in every channel)."""
  return np.all((image == 127) | (image == 128), axis=-1)


def _is_black(image):
  return np.all(image == 0, axis=-1)


def _matches_colour(image, colour):
  """(H, W) bool: pixel equals the reference colour up to uint8 rounding."""
  return np.all(np.abs(image.astype(np.float64) - REFERENCE_RGB_255[colour]) <= 1.0, axis=-1)


@pytest.fixture(scope="module")
def train_small():
  return trifeature.generate("train", image_size=S, num_images=300, seed=3, progress=False)


def test_factor_tables_match_specification():
  assert trifeature.FACTORS == ("shape", "texture", "colour")
  assert trifeature.SHAPES == EXPECTED_SHAPES
  assert trifeature.TEXTURES == EXPECTED_TEXTURES
  assert trifeature.COLOURS == tuple(EXPECTED_COLOURS)
  assert trifeature.COLOUR_RGB.shape == (10, 3)
  np.testing.assert_allclose(trifeature.COLOUR_RGB, REFERENCE_RGB_255 / 255.0)


def test_generate_is_deterministic_and_seed_dependent():
  kwargs = dict(image_size=S, num_images=20, progress=False)
  a = trifeature.generate("train", seed=0, **kwargs)
  b = trifeature.generate("train", seed=0, **kwargs)
  c = trifeature.generate("train", seed=1, **kwargs)
  assert a.images.shape == (20, S, S, 3) and a.images.dtype == np.uint8
  np.testing.assert_array_equal(a.images, b.images)
  for name in trifeature.FACTORS:
    assert a.labels[name].dtype == np.int32 and a.labels[name].shape == (20,)
    np.testing.assert_array_equal(a.labels[name], b.labels[name])
  assert not np.array_equal(a.images, c.images)


def _combination_counts(data):
  triples = np.stack([data.labels[name] for name in trifeature.FACTORS], axis=1)
  uniques, counts = np.unique(triples, axis=0, return_counts=True)
  return {tuple(t) for t in uniques}, counts


def test_splits_partition_combinations_80_20_and_spread_renders_evenly():
  train = trifeature.generate("train", image_size=16, num_images=1600, seed=7, progress=False)
  test = trifeature.generate("test", image_size=16, num_images=1000, seed=7, progress=False)
  train_combos, train_counts = _combination_counts(train)
  test_combos, test_counts = _combination_counts(test)
  assert len(train_combos) == 800 and len(test_combos) == 200
  assert not train_combos & test_combos
  assert len(train_combos | test_combos) == 1000
  assert set(train_counts) == {2} and set(test_counts) == {5}
  # Each factor value appears in both splits (otherwise a probe could not generalise).
  for k in range(3):
    assert {t[k] for t in test_combos} == set(range(10))
  # A different seed chooses a different split.
  other = trifeature.generate("test", image_size=16, num_images=200, seed=8, progress=False)
  assert _combination_counts(other)[0] != test_combos


def test_every_colour_renders_with_its_reference_rgb():
  for colour in range(10):
    image = trifeature.render(3, SOLID, colour, S, np.random.default_rng(colour))
    foreground = ~_is_grey(image)
    assert foreground.sum() > 100
    assert np.all(_matches_colour(image, colour)[foreground])


def test_pixels_are_background_black_or_label_colour(train_small):
  for image, colour, texture in zip(
      train_small.images, train_small.labels["colour"], train_small.labels["texture"]
  ):
    grey, black, coloured = _is_grey(image), _is_black(image), _matches_colour(image, colour)
    assert np.all(grey | black | coloured)
    assert coloured.sum() > 0
    # The shape stays inside the image: the border is background.
    border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    assert np.all(border)
    # Solid texture fills the shape; every other texture leaves some off (black) pixels.
    if texture == SOLID:
      assert black.sum() == 0
    else:
      assert black.sum() > 0


def _solid_area(shape, size, seeds=range(8)):
  """Mean foreground pixel count of solid renders of a shape."""
  return np.mean(
      [
          (~_is_grey(trifeature.render(shape, SOLID, 0, size, np.random.default_rng(s)))).sum()
          for s in seeds
      ]
  )


def test_shape_areas_match_geometry_and_differ():
  size = 64
  radius = 0.3 * size  # documented shape radius: 0.3 of the image side
  square = _solid_area(EXPECTED_SHAPES.index("square"), size)
  circle = _solid_area(EXPECTED_SHAPES.index("circle"), size)
  plus = _solid_area(EXPECTED_SHAPES.index("plus"), size)
  triangle = _solid_area(EXPECTED_SHAPES.index("triangle"), size)
  # Analytic areas in units of radius^2: square half-side 0.7, disc radius 0.85, plus arms
  # 1.9 x 0.5 overlapping in 0.5 x 0.5, equilateral triangle of circumradius 1.
  np.testing.assert_allclose(square, (1.4 * radius) ** 2, rtol=0.05)
  np.testing.assert_allclose(circle, np.pi * (0.85 * radius) ** 2, rtol=0.05)
  np.testing.assert_allclose(plus, (2 * 1.9 * 0.5 - 0.25) * radius**2, rtol=0.05)
  np.testing.assert_allclose(triangle, 3 * np.sqrt(3) / 4 * radius**2, rtol=0.05)
  assert square > 1.1 * plus


def test_shapes_are_distinct_masks_under_the_same_placement():
  masks = [
      ~_is_grey(trifeature.render(k, SOLID, 0, 64, np.random.default_rng(0))) for k in range(10)
  ]
  for i in range(10):
    for j in range(i + 1, 10):
      assert np.sum(masks[i] != masks[j]) > 40, (EXPECTED_SHAPES[i], EXPECTED_SHAPES[j])


def test_textures_solid_stripes_and_distinct_patterns():
  circle = EXPECTED_SHAPES.index("circle")
  images = [trifeature.render(circle, t, 9, 64, np.random.default_rng(1)) for t in range(10)]
  foreground = ~_is_grey(images[SOLID])
  on = [np.all(image == 255, axis=-1) for image in images]
  assert np.all(on[SOLID] == foreground)
  stripes_on = on[EXPECTED_TEXTURES.index("stripes")][foreground].mean()
  assert 0.15 < stripes_on < 0.5  # line width about 0.3 of the period
  for t in range(1, 10):
    fraction = on[t][foreground].mean()
    assert 0.05 < fraction < 0.95, EXPECTED_TEXTURES[t]
  for i in range(10):
    for j in range(i + 1, 10):
      assert np.mean(on[i][foreground] != on[j][foreground]) > 0.05, (
          EXPECTED_TEXTURES[i],
          EXPECTED_TEXTURES[j],
      )


def test_stripes_have_the_documented_period():
  size = 128  # reference scale: period 10 px
  image = trifeature.render(
      EXPECTED_SHAPES.index("square"),
      EXPECTED_TEXTURES.index("stripes"),
      0,
      size,
      np.random.default_rng(2),
  )
  on = np.all(image == 255 * np.array([1, 0, 0]), axis=-1).astype(np.float64)
  fg = ~_is_grey(image)
  # Along any line through the shape, stripes of period p at angle phi repeat every
  # p / |cos(phi)| pixels, so the 2-D spectrum of the on-mask peaks at radius size / p.
  centred = np.where(fg, on - on[fg].mean(), 0.0)
  power = np.abs(np.fft.fftshift(np.fft.fft2(centred))) ** 2
  ky, kx = np.unravel_index(np.argmax(power), power.shape)
  freq = np.hypot(ky - size // 2, kx - size // 2)
  np.testing.assert_allclose(size / freq, 10.0, rtol=0.15)


def test_placement_is_independent_of_resolution():
  small = trifeature.generate("train", image_size=32, num_images=6, seed=5, progress=False)
  large = trifeature.generate("train", image_size=128, num_images=6, seed=5, progress=False)
  for name in trifeature.FACTORS:
    np.testing.assert_array_equal(small.labels[name], large.labels[name])
  for a, b in zip(small.images, large.images):
    centroid_a = np.argwhere(~_is_grey(a)).mean(axis=0) / 32
    centroid_b = np.argwhere(~_is_grey(b)).mean(axis=0) / 128
    np.testing.assert_allclose(centroid_a, centroid_b, atol=0.06)


def test_load_caches_and_reads_back(tmp_path, monkeypatch):
  kwargs = dict(image_size=S, num_images=12, seed=4)
  first = trifeature.load("test", cache_dir=str(tmp_path), **kwargs)
  files = os.listdir(tmp_path)
  assert len(files) == 1 and files[0].endswith(".npz")

  def fail(*args, **kw):
    raise AssertionError("generate must not run when the cache exists")

  monkeypatch.setattr(trifeature, "generate", fail)
  second = trifeature.load("test", cache_dir=str(tmp_path), **kwargs)
  np.testing.assert_array_equal(first.images, second.images)
  for name in trifeature.FACTORS:
    np.testing.assert_array_equal(first.labels[name], second.labels[name])
  # Other arguments are a different cache entry.
  with pytest.raises(AssertionError, match="must not run"):
    trifeature.load("test", cache_dir=str(tmp_path), image_size=S, num_images=13, seed=4)


def test_load_uses_env_cache_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("CL_JAX_CACHE", str(tmp_path))
  trifeature.load("train", image_size=16, num_images=3, seed=0)
  assert len([f for f in os.listdir(tmp_path) if f.endswith(".npz")]) == 1


def test_interrupted_write_leaves_no_cache_file(tmp_path, monkeypatch):
  def interrupted(file, **arrays):
    # While the data is being written nothing exists under a final .npz name yet.
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    file.write(b"partial")
    raise KeyboardInterrupt

  monkeypatch.setattr(trifeature.np, "savez_compressed", interrupted)
  with pytest.raises(KeyboardInterrupt):
    trifeature.load("train", image_size=16, num_images=3, seed=0, cache_dir=str(tmp_path))
  assert os.listdir(tmp_path) == []
  monkeypatch.undo()
  data = trifeature.load("train", image_size=16, num_images=3, seed=0, cache_dir=str(tmp_path))
  assert data.images.shape == (3, 16, 16, 3)


def test_source_records(train_small):
  source = trifeature.TrifeatureSource(train_small)
  assert len(source) == 300
  assert source.num_classes == {"shape": 10, "texture": 10, "colour": 10}
  record = source[np.int64(17)]
  assert set(record) == {"image", "shape", "texture", "colour"}
  np.testing.assert_array_equal(record["image"], train_small.images[17])
  assert record["image"].shape == (S, S, 3) and record["image"].dtype == np.uint8
  for name in trifeature.FACTORS:
    assert type(record[name]) is int
    assert record[name] == train_small.labels[name][17]
  with pytest.raises(IndexError):
    source[300]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(split="val"), "split"),
        (dict(image_size=8), "image_size"),
        (dict(num_images=0), "num_images"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_arguments_raise(kwargs, message, tmp_path):
  args = dict(split="train", image_size=S, num_images=2, seed=0) | kwargs
  split = args.pop("split")
  with pytest.raises(ValueError, match=message):
    trifeature.generate(split, progress=False, **args)
  with pytest.raises(ValueError, match=message):
    trifeature.load(split, cache_dir=str(tmp_path), **args)


def test_render_rejects_bad_factor_indices():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="shape"):
    trifeature.render(10, 0, 0, S, rng)
  with pytest.raises(ValueError, match="texture"):
    trifeature.render(0, -1, 0, S, rng)
  with pytest.raises(ValueError, match="colour"):
    trifeature.render(0, 0, 10, S, rng)
  with pytest.raises(ValueError, match="image_size"):
    trifeature.render(0, 0, 0, 15, rng)


def test_default_texture_angle_is_360_and_changes_nothing(tmp_path):
  assert trifeature.MAX_TEXTURE_ANGLE_DEG == 360.0
  for seed in range(4):
    for texture in range(10):  # noise included: its seed is drawn after the six floats
      shape, colour = (seed + texture) % 10, (3 * seed + texture) % 10
      default = trifeature.render(shape, texture, colour, 64, np.random.default_rng(seed))
      explicit = trifeature.render(
          shape, texture, colour, 64, np.random.default_rng(seed), max_texture_angle=360.0
      )
      np.testing.assert_array_equal(default, explicit)
  kwargs = dict(image_size=16, num_images=20, seed=1, progress=False)
  np.testing.assert_array_equal(
      trifeature.generate("train", **kwargs).images,
      trifeature.generate("train", max_texture_angle=360.0, **kwargs).images,
  )

  # The default cache name has no _tex part (caches written before the option stay valid).
  load = dict(image_size=16, num_images=2, seed=4, cache_dir=str(tmp_path))
  trifeature.load("test", **load)
  trifeature.load("test", max_texture_angle=360.0, **load)
  base = f"trifeature_v{trifeature.CACHE_VERSION}_test_seed4_16px_n2"
  assert os.listdir(tmp_path) == [f"{base}.npz"]
  trifeature.load("test", max_texture_angle=0.0, **load)
  trifeature.load("test", max_shape_angle=0.0, max_texture_angle=90.0, **load)
  assert sorted(os.listdir(tmp_path)) == sorted(
      [f"{base}.npz", f"{base}_tex0.npz", f"{base}_angle0_tex90.npz"]
  )


def test_texture_angle_draws_the_same_numbers_and_keeps_the_placement():
  square, stripes = EXPECTED_SHAPES.index("square"), EXPECTED_TEXTURES.index("stripes")
  for seed in range(4):
    rngs = [np.random.default_rng(seed) for _ in range(2)]
    images = [
        trifeature.render(square, stripes, 9, 64, rng, max_texture_angle=a)
        for rng, a in zip(rngs, (0.0, 360.0))
    ]
    np.testing.assert_array_equal(_is_grey(images[0]), _is_grey(images[1]))  # same shape
    assert rngs[0].random() == rngs[1].random()  # same draws, so the next image is the same


def _rows_constant(on, fg):
  """Whether in every row the texture is on at all or at none of the shape's pixels."""
  return all(len(np.unique(on[r][fg[r]])) <= 1 for r in range(on.shape[0]))


def test_texture_angle_zero_keeps_every_texture_in_one_orientation():
  square = EXPECTED_SHAPES.index("square")
  stripes = EXPECTED_TEXTURES.index("stripes")
  white = list(EXPECTED_COLOURS).index("white")
  aligned = {0.0: [], 360.0: []}
  for angle in aligned:
    for seed in range(6):
      image = trifeature.render(
          square, stripes, white, 64, np.random.default_rng(seed), max_texture_angle=angle
      )
      fg, on = ~_is_grey(image), np.all(image == 255, axis=-1)
      assert 0.1 < on[fg].mean() < 0.6  # stripes, not a solid or empty shape
      aligned[angle].append(_rows_constant(on, fg))
      if angle == 0.0:
        # Unrotated stripes run along x (each row all on or all off, rows differ); a quarter
        # turn of the image makes them run along y, so the turn shows in the texture.
        assert len(np.unique(on[fg])) == 2
        assert not _rows_constant(np.rot90(on), np.rot90(fg))
  assert all(aligned[0.0])
  assert not all(aligned[360.0])
