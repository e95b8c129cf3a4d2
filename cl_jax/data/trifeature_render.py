"""Procedural rendering of one Trifeature image (Hermann & Lampinen, 2020).

An image shows one shape, filled with one binary texture, in one colour, on a grey background:

    pixel(x) = mask(x) * texture(x) * colour + (1 - mask(x)) * 0.5

The texture is binary, so inside the shape a pixel is either the colour (texture on) or black
(texture off); outside the shape it is grey 0.5, stored as uint8 128 (round(127.5), half up).

Geometry, in pixel units with the origin at the image centre (x to the right, y downwards):
  * the shape is defined in unit coordinates (every shape lies inside the unit disc), scaled to
    a radius of ``SHAPE_RADIUS * image_size``, rotated by an angle drawn from U[-a, a) degrees
    (a = ``max_shape_angle``, default 45) and shifted by an offset drawn from
    U[-MAX_OFFSET, MAX_OFFSET] * image_size per axis, so the whole shape stays inside the image;
  * the texture is a pattern with period ``texture_period(image_size)`` pixels and line width
    ``LINE_FRACTION`` of the period, rotated by an angle drawn from U[0, a) degrees
    (a = ``max_texture_angle``, default 360; 0 keeps every texture in one orientation) and
    shifted by a random phase drawn from U[0, 1) periods per axis.

Hand-written in NumPy because no maintained library renders these factors; every mask is a
vectorised predicate over the pixel-centre grid (no anti-aliasing, so each pixel takes exactly
one of the three values above).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

SHAPES = (
    "triangle",
    "square",
    "plus",
    "circle",
    "tee",
    "rhombus",
    "pentagon",
    "star",
    "fivesquare",
    "trapezoid",
)
TEXTURES = (
    "solid",
    "stripes",
    "grid",
    "hexgrid",
    "dots",
    "noise",
    "triangles",
    "zigzags",
    "rain",
    "pluses",
)
COLOURS = (
    "red",
    "green",
    "blue",
    "yellow",
    "pink",
    "cyan",
    "purple",
    "ocean",
    "orange",
    "white",
)
# (10, 3) float64 in [0, 1], row i is the RGB of COLOURS[i].
COLOUR_RGB = np.array(
    [
        (1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        (0.0, 0.0, 1.0),
        (1.0, 1.0, 0.0),
        (1.0, 0.4, 1.0),
        (0.0, 1.0, 1.0),
        (0.3, 0.0, 0.5),
        (0.1, 0.4, 0.5),
        (1.0, 0.6, 0.0),
        (1.0, 1.0, 1.0),
    ],
    dtype=np.float64,
)
COLOUR_RGB.setflags(write=False)

# uint8 encoding of the colours and of grey 0.5: floor(255 * v + 0.5) (round half up).
COLOUR_UINT8 = np.floor(COLOUR_RGB * 255.0 + 0.5).astype(np.uint8)
COLOUR_UINT8.setflags(write=False)
BACKGROUND_UINT8 = 128

# Shape radius and the largest centre offset, as fractions of the image side. Every shape lies
# in the unit disc, so with SHAPE_RADIUS + MAX_OFFSET = 0.48 the rotated shape stays inside the
# image, clear of the border pixels.
SHAPE_RADIUS = 0.3
MAX_OFFSET = 0.18
MAX_SHAPE_ANGLE_DEG = 45.0
MAX_TEXTURE_ANGLE_DEG = 360.0

# Texture scale. Hermann & Lampinen use a period of about 10 px and line width 3 px; the IFM
# paper renders at 128 px, so 128 px is the reference scale and the period scales with the
# image side. Below 64 px the period is held at 5 px so every pattern still resolves at 32 px.
REFERENCE_SIZE = 128
REFERENCE_PERIOD = 10.0
MIN_PERIOD = 5.0
LINE_FRACTION = 0.3


def texture_period(image_size: int) -> float:
  """Texture period in pixels: max(MIN_PERIOD, REFERENCE_PERIOD * image_size / REFERENCE_SIZE)."""
  return max(MIN_PERIOD, REFERENCE_PERIOD * image_size / REFERENCE_SIZE)


# ----------------------------------------------------------------------------------------------
# Shapes: predicates on unit coordinates (u to the right, v upwards), arrays of any equal shape.

ShapeFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _regular_polygon(n: int, radius: float, inner_radius: float | None = None) -> np.ndarray:
  """(n or 2n, 2) vertices of a regular n-gon (or n-pointed star) with a vertex pointing up."""
  if inner_radius is None:
    angles = np.pi / 2 + 2 * np.pi * np.arange(n) / n
    radii = np.full(n, radius)
  else:
    angles = np.pi / 2 + np.pi * np.arange(2 * n) / n
    radii = np.where(np.arange(2 * n) % 2 == 0, radius, inner_radius)
  return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _polygon(vertices) -> ShapeFn:
  """Even-odd point-in-polygon test (crossing number) for a closed (E, 2) vertex list."""
  vertices = np.asarray(vertices, dtype=np.float64)
  x1, y1 = vertices[:, 0], vertices[:, 1]
  x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
  straddle_dy = np.where(y1 == y2, 1.0, y2 - y1)  # horizontal edges never straddle

  def inside(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    u, v = u[..., None], v[..., None]
    straddles = (y1 > v) != (y2 > v)
    crossing_x = x1 + (v - y1) * (x2 - x1) / straddle_dy
    return np.sum(straddles & (u < crossing_x), axis=-1) % 2 == 1

  return inside


def _rectangles(boxes) -> ShapeFn:
  """Union of axis-aligned boxes given as (u_min, u_max, v_min, v_max)."""
  boxes = np.asarray(boxes, dtype=np.float64)

  def inside(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    u, v = u[..., None], v[..., None]
    in_box = (u >= boxes[:, 0]) & (u <= boxes[:, 1]) & (v >= boxes[:, 2]) & (v <= boxes[:, 3])
    return np.any(in_box, axis=-1)

  return inside


def _disc(radius: float) -> ShapeFn:
  return lambda u, v: u * u + v * v <= radius * radius


def _fivesquare(half: float) -> ShapeFn:
  """Five squares of half-side ``half`` in the die-five layout, touching at their corners."""
  centres = [(0, 0), (-2, -2), (-2, 2), (2, -2), (2, 2)]
  return _rectangles(
      [(half * (i - 1), half * (i + 1), half * (j - 1), half * (j + 1)) for i, j in centres]
  )


SHAPE_FNS: tuple[ShapeFn, ...] = (
    _polygon(_regular_polygon(3, 1.0)),  # triangle
    _rectangles([(-0.7, 0.7, -0.7, 0.7)]),  # square
    _rectangles([(-0.95, 0.95, -0.25, 0.25), (-0.25, 0.25, -0.95, 0.95)]),  # plus
    _disc(0.85),  # circle
    _rectangles([(-0.75, 0.75, 0.25, 0.65), (-0.2, 0.2, -0.95, 0.25)]),  # tee
    _polygon([(0.95, 0.0), (0.0, 0.55), (-0.95, 0.0), (0.0, -0.55)]),  # rhombus
    _polygon(_regular_polygon(5, 0.95)),  # pentagon
    _polygon(_regular_polygon(5, 1.0, inner_radius=0.4)),  # star
    _fivesquare(0.23),  # fivesquare
    _polygon([(-0.9, -0.4), (0.9, -0.4), (0.45, 0.5), (-0.45, 0.5)]),  # trapezoid
)


# ----------------------------------------------------------------------------------------------
# Textures: predicates on texture coordinates (x, y) in pixels, period p and line width w.

# Each takes (x, y, p, w, rng); only the noise texture draws from rng.
TextureFn = Callable[[np.ndarray, np.ndarray, float, float, np.random.Generator], np.ndarray]


def _cell(x: np.ndarray, y: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
  """Offsets (a, b) from the centre of the p x p lattice cell holding (x, y), in [-p/2, p/2)."""
  return np.mod(x, p) - p / 2, np.mod(y, p) - p / 2


def _solid(x, y, p, w, rng):
  return np.ones(x.shape, dtype=bool)


def _stripes(x, y, p, w, rng):
  return np.mod(y, p) < w


def _grid(x, y, p, w, rng):
  return (np.mod(x, p) < w) | (np.mod(y, p) < w)


_HEX_NORMALS = np.array([[np.cos(t), np.sin(t)] for t in np.deg2rad([0.0, 60.0, 120.0])])


def _hexgrid(x, y, p, w, rng):
  """Honeycomb lines: the Voronoi boundaries of a triangular lattice with spacing p.

  The nearest lattice point is a corner of the lattice parallelogram holding the point; the
  hexagonal cell has apothem p / 2 along the three normals at 0, 60, 120 degrees, and the point
  is on a line where max_k |r . n_k| > (p - w) / 2 for r the offset from the nearest point.
  """
  s = 2.0 * y / (np.sqrt(3.0) * p)  # lattice basis (p, 0) and (p / 2, p * sqrt(3) / 2)
  r = x / p - s / 2
  best = np.full(x.shape + (2,), np.inf)
  best_d2 = np.full(x.shape, np.inf)
  for di in (0.0, 1.0):
    for dj in (0.0, 1.0):
      i, j = np.floor(r) + di, np.floor(s) + dj
      off = np.stack([x - p * (i + j / 2), y - p * j * np.sqrt(3.0) / 2], axis=-1)
      d2 = np.sum(off * off, axis=-1)
      closer = d2 < best_d2
      best_d2 = np.where(closer, d2, best_d2)
      best = np.where(closer[..., None], off, best)
  return np.max(np.abs(best @ _HEX_NORMALS.T), axis=-1) > (p - w) / 2


def _dots(x, y, p, w, rng):
  a, b = _cell(x, y, p)
  return a * a + b * b <= (0.3 * p) ** 2


def _triangles(x, y, p, w, rng):
  """One equilateral triangle per lattice cell: circumradius 0.45 p, apex towards -y.

  Inside where r . n <= apothem (0.225 p) for the three outward edge normals n = (0, 1),
  (sqrt(3)/2, -1/2), (-sqrt(3)/2, -1/2) and r = (a, b) the offset from the cell centre.
  """
  a, b = _cell(x, y, p)
  apothem = 0.225 * p
  return (
      (b <= apothem)
      & (np.sqrt(3) / 2 * a - b / 2 <= apothem)
      & (-np.sqrt(3) / 2 * a - b / 2 <= apothem)
  )


def _zigzags(x, y, p, w, rng):
  """Lines y = (p / 2) * |2 frac(x / p) - 1| + k p; slope 1, so vertical width w * sqrt(2)."""
  wave = (p / 2) * np.abs(2 * np.mod(x / p, 1.0) - 1)
  return np.mod(y - wave, p) < w * np.sqrt(2.0)


def _rain(x, y, p, w, rng):
  """Short vertical dashes (length 0.7 p), each lattice row shifted by half a period."""
  row = np.floor(y / p)
  a, b = _cell(x + row * p / 2, y, p)
  return (np.abs(a) <= w / 2) & (np.abs(b) <= 0.35 * p)


def _pluses(x, y, p, w, rng):
  a, b = _cell(x, y, p)
  arm = 0.45 * p  # longer than the dots' radius (0.3 p), so pluses stay distinct at small p
  return ((np.abs(a) <= w / 2) & (np.abs(b) <= arm)) | ((np.abs(b) <= w / 2) & (np.abs(a) <= arm))


def _noise(x, y, p, w, rng):
  """Independent Bernoulli(1/2) values on square cells of side w."""
  cells = np.floor(x / w).astype(np.int64), np.floor(y / w).astype(np.int64)
  lo_x, lo_y = cells[0].min(), cells[1].min()
  table = rng.random((cells[0].max() - lo_x + 1, cells[1].max() - lo_y + 1)) < 0.5
  return table[cells[0] - lo_x, cells[1] - lo_y]


TEXTURE_FNS: tuple[TextureFn, ...] = (
    _solid,
    _stripes,
    _grid,
    _hexgrid,
    _dots,
    _noise,
    _triangles,
    _zigzags,
    _rain,
    _pluses,
)


# ----------------------------------------------------------------------------------------------


def _check_index(name: str, value: int, names: tuple[str, ...]) -> None:
  if not 0 <= int(value) < len(names):
    raise ValueError(f"{name} must be an index in [0, {len(names)}) into {names}; got {value}.")


def render(
    shape: int,
    texture: int,
    colour: int,
    image_size: int,
    rng: np.random.Generator,
    max_shape_angle: float = MAX_SHAPE_ANGLE_DEG,
    max_texture_angle: float = MAX_TEXTURE_ANGLE_DEG,
) -> np.ndarray:
  """Renders one Trifeature image.

  Args:
    shape, texture, colour: indices into SHAPES, TEXTURES and COLOURS.
    image_size: side S of the square image in pixels (>= 16).
    rng: source of the random placement; it draws six uniform floats (shape angle, two offset
      fractions, texture angle, two texture phases) and one integer seed for the noise texture,
      whatever the factors and image_size, so a given rng state gives the same placement at
      every resolution.
    max_shape_angle: the shape's angle is drawn from U[-a, a) degrees (default 45; 0 renders
      every shape upright, so that a rotation of the image is visible in it).
    max_texture_angle: the texture's angle is drawn from U[0, a) degrees (default 360; 0
      renders every texture unrotated, stripes, zigzags and rain all in one orientation, so
      that a quarter turn of the image changes its texture's orientation). The same random
      numbers are drawn whatever a, and a = 360 gives exactly the images of earlier versions.

  Returns:
    (S, S, 3) uint8 image: COLOUR_UINT8[colour] where mask and texture are on, 0 where the mask
    is on and the texture off, BACKGROUND_UINT8 (grey 0.5) outside the mask.
  """
  _check_index("shape", shape, SHAPES)
  _check_index("texture", texture, TEXTURES)
  _check_index("colour", colour, COLOURS)
  if int(image_size) < 16:
    raise ValueError(f"image_size must be >= 16 pixels; got {image_size}.")
  size = int(image_size)

  draws = rng.random(6)
  shape_angle = np.deg2rad(max_shape_angle * (2 * draws[0] - 1))
  offset = MAX_OFFSET * size * (2 * draws[1:3] - 1)
  texture_angle = 2 * np.pi * draws[3] * (max_texture_angle / 360.0)
  period = texture_period(size)
  phase = period * draws[4:6]
  texture_seed = rng.integers(2**63)

  # Only the window around the disc that holds the shape is evaluated (the rest is background),
  # and the texture only at the shape's pixels.
  radius = SHAPE_RADIUS * size
  lo = np.clip(np.floor(offset + size / 2 - radius), 0, size).astype(int)
  hi = np.clip(np.ceil(offset + size / 2 + radius), 0, size).astype(int)
  cols = np.arange(lo[0], hi[0], dtype=np.float64) + 0.5 - size / 2
  rows = np.arange(lo[1], hi[1], dtype=np.float64) + 0.5 - size / 2
  x, y = np.meshgrid(cols, rows, indexing="xy")  # x: column, y: row (downwards)

  # Shape frame: undo the offset and rotation, scale to unit radius, flip y to point up.
  dx, dy = x - offset[0], y - offset[1]
  c, s = np.cos(shape_angle), np.sin(shape_angle)
  u = (c * dx + s * dy) / radius
  v = -(-s * dx + c * dy) / radius
  mask = SHAPE_FNS[shape](u, v)
  x, y = x[mask], y[mask]

  # Texture frame: rotate by the texture angle, then shift by the phase.
  c, s = np.cos(texture_angle), np.sin(texture_angle)
  tx = c * x + s * y + phase[0]
  ty = -s * x + c * y + phase[1]
  texture_rng = np.random.default_rng(texture_seed)
  pattern = TEXTURE_FNS[texture](tx, ty, period, LINE_FRACTION * period, texture_rng)

  image = np.full((size, size, 3), BACKGROUND_UINT8, dtype=np.uint8)
  window = image[lo[1] : hi[1], lo[0] : hi[0]]
  window[mask] = np.where(pattern[:, None], COLOUR_UINT8[colour], np.uint8(0))
  return image
