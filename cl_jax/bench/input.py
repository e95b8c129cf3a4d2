"""The training loop end to end on JPEG decoding: can the host input pipeline feed the step?

python -m cl_jax.bench.step --config=configs/NAME.py[:preset] --input=jpeg [--jpeg_dir=DIR]
    [--jpeg_images=512] [--steps=10] [--warmup=2] [--json]

The pretraining images are a generated ImageNet-like folder (`make_jpeg_folder`,
`<root>/<class>/<i>.JPEG`, 10 classes, cached): widths 300-600 px, aspect ratios 3:4 to 4:3,
smooth 1/f content with a few textured objects, PIL quality 90, so that the files are about as
large as ImageNet's (50-150 KB) and about as costly to decode. Three decodings (DECODES,
`JpegSource`): exact (full size, as ImageFolderSource), reduced (libjpeg's DCT-domain 1/2, 1/4
or 1/8, the largest that keeps every possible crop at least twice the view's side; the
faithful default) and reduced-max (at least the view's side: the largest reduction that never
upsamples). Printed:

  decode    ms per image of PIL's decoding at full size and at 1/2, 1/4, 1/8; per reduced
            decoding its mean reduction and how far its views are from exact decoding's
            (`view_difference`, beside a one-pixel move of the crop for scale);
  pipeline  img/s of cl_jax.data.pipeline.pretrain_dataset alone (decode, the views' random
            resized crops and flips, batching) through pipeline.make_iterator with 0, 1, 2, 4,
            ... grain workers (`worker_counts`), and per worker, for each decoding;
  loop      img/s of train.pretrain's loop (pipeline -> parallel.global_batch -> the jitted
            lean train step; no checkpoints, metrics or logging) on the JPEG folder for each
            decoding with 0 and N (the CPU count) workers, and of the same loop on two batches
            of the pipeline held in memory, which runs before the first JPEG loop and after
            each; ratio = JPEG loop img/s / the mean of the in-memory runs beside it (1: the
            pipeline keeps up with the step); and a verdict on the fastest faithful decoding.

Worker start-up and compilation are kept out of every rate: the timing starts after warmup
batches (or steps) taken from the started iterator.
"""

import concurrent.futures
import dataclasses
import io
import json
import math
import multiprocessing
import os
import shutil
import time

import jax
import numpy as np
import PIL.Image
from PIL import ImageDraw, ImageFilter

from cl_jax import config_check, train
from cl_jax import train_step as step_lib
from cl_jax.data import geometric, image_folder, pipeline
from cl_jax.runtime import parallel
from cl_jax.runtime.errors import UsageError

NUM_CLASSES = 10
FOLDER_VERSION = 1
MANIFEST = "folder.json"
QUALITY = 90
WIDTH_RANGE = (300, 600)  # pixels, uniform
ASPECT_RANGE = (3 / 4, 4 / 3)  # width / height, log-uniform
# The aspect-ratio range of the pipeline's crops (geometric.sample_crop's default, which
# pipeline.pretrain_dataset does not change).
CROP_RATIO = (3 / 4, 4 / 3)


def default_root(num_images: int, seed: int) -> str:
  """The cached folder's default place: $CL_JAX_CACHE (else ~/.cache/cl_jax)/jpeg_folder_...."""
  home = os.path.join(os.path.expanduser("~"), ".cache", "cl_jax")
  cache = os.environ.get("CL_JAX_CACHE") or home
  return os.path.join(cache, f"jpeg_folder_v{FOLDER_VERSION}_seed{seed}_n{num_images}")


def class_names() -> list[str]:
  """The folder's class names, in label order."""
  return [f"class{c:02d}" for c in range(NUM_CLASSES)]


def image_path(root: str, i: int) -> str:
  """Image i's file: `<root>/class<i mod 10>/<i>.JPEG`."""
  return os.path.join(root, class_names()[i % NUM_CLASSES], f"{i:06d}.JPEG")


def _fields(rng: np.random.Generator, height: int, width: int, alphas) -> np.ndarray:
  """(len(alphas), height, width) float64 Gaussian fields with amplitude spectra 1/f^alpha (the
  power spectrum of natural images falls as about 1/f^2), each of zero mean and unit std."""
  fy = np.fft.fftfreq(height)[:, None]
  fx = np.fft.rfftfreq(width)[None, :]
  f = np.hypot(fy, fx)
  f[0, 0] = 1.0
  alphas = np.asarray(alphas, np.float64)[:, None, None]
  amplitude = f[None] ** -alphas
  amplitude[:, 0, 0] = 0.0
  shape = (len(alphas), height, width // 2 + 1)
  spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * amplitude
  x = np.fft.irfft2(spectrum, s=(height, width), axes=(1, 2))
  return x / x.std(axis=(1, 2), keepdims=True)


def natural_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """A smooth natural-looking (height, width, 3) uint8 image: a 1/f luminance field with
  smoother, weaker colour fields on a random base colour, 2-6 soft-edged ellipses and polygons
  of their own colour and 1/f texture, and a little pixel noise (film grain)."""
  lum, cb, cr, tex_a, tex_b = _fields(
      rng, height, width, [rng.uniform(0.9, 1.2), 1.8, 1.8, rng.uniform(0.8, 1.5), 1.1]
  )
  img = rng.uniform(60, 190, 3) + 35 * lum[..., None]
  img += 12 * cb[..., None] * np.array([1.0, -0.5, -0.5])
  img += 12 * cr[..., None] * np.array([0.0, 1.0, -1.0])
  for n in range(int(rng.integers(2, 7))):
    mask = PIL.Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(mask)
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    r = rng.uniform(0.1, 0.35) * min(height, width)
    if rng.random() < 0.5:
      ry = r * rng.uniform(0.5, 1.5)
      draw.ellipse([cx - r, cy - ry, cx + r, cy + ry], fill=255)
    else:
      k = int(rng.integers(3, 8))
      angle, radius = np.sort(rng.uniform(0, 2 * np.pi, k)), r * rng.uniform(0.5, 1.2, k)
      draw.polygon(list(zip(cx + radius * np.cos(angle), cy + radius * np.sin(angle))), fill=255)
    blurred = mask.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.5)))
    m = np.asarray(blurred, np.float64)[..., None] / 255.0
    texture = np.roll(tex_a if n % 2 == 0 else tex_b, int(rng.integers(0, height)), axis=0)
    obj = rng.uniform(20, 235, 3) + rng.uniform(10, 30) * texture[..., None]
    img = img * (1 - m) + obj * m
  img += rng.normal(0, 2.0, img.shape)
  return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def image_size(seed: int, i: int) -> tuple[int, int]:
  """(height, width) of image i: width ~ U{300..600}, aspect log-uniform in [3/4, 4/3]."""
  rng = np.random.default_rng([seed, i, 0])
  width = int(rng.integers(WIDTH_RANGE[0], WIDTH_RANGE[1] + 1))
  aspect = math.exp(rng.uniform(math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])))
  return round(width / aspect), width


def _write_image(args: tuple[str, int, int]) -> int:
  """Writes image i of the folder of `seed` under `root`; returns its file size in bytes."""
  root, seed, i = args
  height, width = image_size(seed, i)
  pixels = natural_image(np.random.default_rng([seed, i, 1]), height, width)
  path = image_path(root, i)
  PIL.Image.fromarray(pixels).save(path, "JPEG", quality=QUALITY)
  return os.path.getsize(path)


def _manifest(num_images: int, seed: int) -> dict:
  return {"version": FOLDER_VERSION, "num_images": num_images, "seed": seed, "quality": QUALITY}


def _is_complete(root: str, num_images: int, seed: int) -> bool:
  try:
    with open(os.path.join(root, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return False
  return {k: manifest.get(k) for k in _manifest(0, 0)} == _manifest(num_images, seed) and all(
      os.path.isfile(image_path(root, i)) for i in range(num_images)
  )


def make_jpeg_folder(root: str, num_images: int, seed: int, workers: int | None = None) -> str:
  """An ImageNet-like JPEG folder `<root>/class<c>/<i>.JPEG` (image i in class i mod 10) of
  `num_images` generated images (`natural_image` at `image_size(seed, i)`, PIL quality 90),
  reused when `root` already holds the complete folder of (num_images, seed).

  The folder is written beside `root` and moved into place once complete, with its manifest
  (folder.json), so an interrupted run leaves no partial folder under `root`. Images are
  written by `workers` processes (default: one per CPU; 0 or 1: in this process). Returns root.

  Raises:
    UsageError: `root` is a file, or a folder neither empty nor this one.
  """
  if num_images < 1:
    raise ValueError(f"num_images must be >= 1, got {num_images}")
  if os.path.exists(root) and not os.path.isdir(root):
    raise UsageError(f"{root!r} is a file; give a folder (new, or holding the generated images)")
  if _is_complete(root, num_images, seed):
    return root
  if os.path.isdir(root) and os.listdir(root):
    raise UsageError(
        f"{root!r} exists and does not hold the generated folder of {num_images} images of "
        f"seed {seed}: remove it or choose another folder"
    )
  partial = f"{root.rstrip(os.sep)}.partial-{os.getpid()}"
  shutil.rmtree(partial, ignore_errors=True)
  for name in class_names():
    os.makedirs(os.path.join(partial, name))
  jobs = [(partial, seed, i) for i in range(num_images)]
  if workers is None:
    workers = os.cpu_count() or 1
  try:
    if workers > 1 and num_images >= 64:
      context = multiprocessing.get_context("spawn")  # no fork of a process running JAX
      with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        list(pool.map(_write_image, jobs, chunksize=16))
    else:
      for job in jobs:
        _write_image(job)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  with open(os.path.join(partial, MANIFEST), "w") as f:
    json.dump(_manifest(num_images, seed), f)
  if os.path.isdir(root):
    os.rmdir(root)  # empty (checked above)
  os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
  os.rename(partial, root)
  return root


def reduction(
    height: int,
    width: int,
    view_size: int,
    crop_scale: tuple[float, float],
    margin: float = 2.0,
    ratio: tuple[float, float] = CROP_RATIO,
) -> int:
  """The largest DCT-domain reduction k in (8, 4, 2, 1) of a (height, width) JPEG that keeps
  every random resized crop of the decoded image at least margin x view_size pixels on both
  sides.

  The decoded image is (ceil(height / k), ceil(width / k)) = (h, w). A crop of area fraction
  s >= crop_scale[0] and aspect r in `ratio` has its shorter side at least
  sqrt(crop_scale[0] h w q), q = min(r, 1/r) over the range's ends; the fallback crop (no
  attempt fitted) is the image clamped to the range, whose shorter side is min(h, w). Both must
  reach margin x view_size.
  """
  q = min(ratio[0], 1 / ratio[0], ratio[1], 1 / ratio[1])
  need = margin * view_size
  for k in (8, 4, 2):
    h, w = -(-height // k), -(-width // k)
    if min(h, w) >= need and math.sqrt(crop_scale[0] * h * w * q) >= need:
      return k
  return 1


class JpegSource(image_folder.ImageFolderSource):
  """ImageFolderSource (`source[i]` = {"image": (H, W, 3) uint8 RGB, "label": int}) that can
  decode each JPEG at reduced size.

  view_size None: exact decoding, as ImageFolderSource. view_size S: PIL's Image.draft lets
  libjpeg decode at 1/k of the size in the DCT domain, k = `reduction` of the header's size:
  the largest of 8, 4, 2, 1 at which the pipeline's smallest possible crop (area fraction
  crop_scale[0] at the extreme aspect ratio) still spans margin x S decoded pixels.

  Why per image and not per crop: the pipeline samples the crops after the source returns the
  image, from its shape, so the source must choose k before any crop is known, for all of
  them. A per-crop k (crops sampled from the header's size first) would reduce large crops
  further, but needs the crops sampled before decoding, outside pipeline.pretrain_dataset;
  and libjpeg's entropy decoding, which does not shrink with k, bounds what it could add
  (`decode_ms`: decoding at 1/8 costs about half of decoding at full size).

  Why a margin: with margin 1 no view is ever upsampled, but the DCT reduction is a
  prefilter of its own (at 1/8 a mean over 8 x 8 blocks, variance k^2 / 12 source pixels^2)
  that adds to the view's antialiased bilinear resize (a triangle of half-width
  r = crop side / S, variance r^2 / 6). r >= margin x k bounds the added variance to
  1 / (2 margin^2) of the resize's own: at most 50% (22% more blur width) with margin 1,
  12.5% (6%) with the default margin 2. `view_difference` measures the outcome. The crop
  boxes are then integer pixels of the reduced image, in its coordinates (the box keys of a
  batch are in decoded pixels; DICR, which reads them, depends on their ratios only).
  """

  def __init__(
      self,
      root: str,
      class_names: list[str],
      *,
      view_size: int | None = None,
      crop_scale: tuple[float, float] = (0.08, 1.0),
      margin: float = 2.0,
  ):
    super().__init__(root, class_names)
    self.view_size = view_size
    self.crop_scale = tuple(crop_scale)
    self.margin = margin

  def reduction(self, width: int, height: int) -> int:
    """k of an image of this size (1 for exact decoding)."""
    if self.view_size is None:
      return 1
    return reduction(height, width, self.view_size, self.crop_scale, self.margin)

  def __getitem__(self, i: int) -> dict:
    if not 0 <= i < len(self):
      raise IndexError(f"index {i} out of range for a source of {len(self)} images")
    with PIL.Image.open(self.files[i]) as image:
      width, height = image.size  # the header's: nothing is decoded yet
      k = self.reduction(width, height)
      if k > 1:
        image.draft("RGB", (max(1, width // k), max(1, height // k)))
      pixels = np.asarray(image.convert("RGB"), np.uint8)
    return {"image": pixels, "label": int(self.labels[i])}


# Decoding modes: the margin of JpegSource's reduction (None: exact decoding). "reduced" is
# the faithful default; "reduced-max" the largest reduction that never upsamples a view.
DECODES = {"exact": None, "reduced": 2.0, "reduced-max": 1.0}
FAITHFUL = ("exact", "reduced")


def sources(root: str, config) -> dict[str, JpegSource]:
  """A JpegSource of the folder `root` for each of DECODES, for `config`'s views."""
  names = class_names()
  size, scale = config.data.image_size, tuple(config.data.crop_scale)
  return {
      mode: (
          JpegSource(root, names)
          if margin is None
          else JpegSource(root, names, view_size=size, crop_scale=scale, margin=margin)
      )
      for mode, margin in DECODES.items()
  }


def reduces(source: JpegSource) -> bool:
  """Whether `source` decodes any of its images at reduced size (from the files' headers)."""
  for path in source.files:
    with PIL.Image.open(path) as image:
      if source.reduction(*image.size) > 1:
        return True
  return False


def _exact_view(image: np.ndarray, box, size: int) -> np.ndarray:
  return geometric.apply_crop(image, geometric.CropParams(np.float32(box), False), size)


def _moved_by_one_pixel(box: np.ndarray, height: int, width: int) -> np.ndarray | None:
  """`box` [y0, x0, y1, x1] moved by one pixel down, up, right or left (the first that stays
  inside the image), or None for a box that spans the whole image."""
  for axis, limit in ((0, height), (1, width)):
    for step in (1.0, -1.0):
      moved = box.astype(np.float64).copy()
      moved[[axis, axis + 2]] += step
      if moved[axis] >= 0 and moved[axis + 2] <= limit:
        return moved
  return None


def view_difference(exact: JpegSource, reduced: JpegSource, indices, seed: int = 0) -> dict:
  """How far reduced decoding's views are from exact decoding's, over the images `indices`.

  One random resized crop per image is sampled on the reduced image (as the pipeline samples
  it), its box scaled to the exact image's pixels, and both are resized to the view size
  (geometric.apply_crop, no flip). Returns mean_abs (the views' mean absolute difference in
  grey levels), mean_reduction (the mean linear reduction) and shift_1px (for scale: the mean
  absolute difference between the exact view and the exact view of its box moved by one
  source pixel, `_moved_by_one_pixel`; None where every box spans its whole image).
  """
  rng = np.random.default_rng(seed)
  size = reduced.view_size
  diffs, factors, shifts = [], [], []
  for i in indices:
    small, full = reduced[i]["image"], exact[i]["image"]
    params = geometric.sample_crop(rng, small.shape[0], small.shape[1], scale=reduced.crop_scale)
    scale = np.array([full.shape[0] / small.shape[0], full.shape[1] / small.shape[1]] * 2)
    box = np.minimum(params.box * scale, [full.shape[0], full.shape[1]] * 2)
    view = _exact_view(full, box, size).astype(np.float64)
    diffs.append(np.abs(_exact_view(small, params.box, size) - view).mean())
    moved = _moved_by_one_pixel(box, full.shape[0], full.shape[1])
    if moved is not None:
      shifts.append(np.abs(_exact_view(full, moved, size) - view).mean())
    factors.append(full.shape[1] / small.shape[1])
  return {
      "mean_abs": round(float(np.mean(diffs)), 3),
      "mean_reduction": round(float(np.mean(factors)), 2),
      "shift_1px": round(float(np.mean(shifts)), 3) if shifts else None,
  }


def decode_ms(files: list[str], factors=(1, 2, 4, 8)) -> dict[int, float]:
  """Mean ms per image of PIL's decoding of `files` (read into memory first) at 1/k size."""
  data = []
  for path in files:
    with open(path, "rb") as f:
      data.append(f.read())
  out = {}
  for k in factors:
    start = time.perf_counter()
    for blob in data:
      with PIL.Image.open(io.BytesIO(blob)) as image:
        if k > 1:
          image.draft("RGB", (image.size[0] // k, image.size[1] // k))
        image.convert("RGB").load()
    out[k] = round(1e3 * (time.perf_counter() - start) / len(data), 3)
  return out


def pipeline_rate(source, config, workers: int, batches: int) -> dict:
  """img/s of the pretraining pipeline alone over `source` with `workers` grain workers.

  The timing covers `batches` batches after max(2, workers + 1) untimed ones (worker start-up
  and the batches the workers had ready by then). Returns a row: workers, img_per_s,
  img_per_s_per_worker (per process that decodes: the main one when workers is 0),
  startup_s (iterator creation to the first batch).
  """
  batch = config.optim.batch_size
  start = time.perf_counter()
  it = pipeline.make_iterator(train.pretrain_data(config, source), workers)
  try:
    next(it)
    startup = time.perf_counter() - start
    for _ in range(max(2, workers + 1) - 1):
      next(it)
    start = time.perf_counter()
    for _ in range(batches):
      next(it)
    rate = batches * batch / (time.perf_counter() - start)
  finally:
    it.close()
  return {
      "workers": workers,
      "img_per_s": round(rate, 1),
      "img_per_s_per_worker": round(rate / max(1, workers), 1),
      "startup_s": round(startup, 2),
  }


@dataclasses.dataclass
class Loop:
  """A config's jitted train step on a mesh and its state, which every timed loop advances."""

  config: object
  mesh: object
  step: object
  state: object


def make_loop(config, num_records: int, mesh) -> Loop:
  """The train state and jitted step of `config` on `mesh`, as train.pretrain builds them (its
  lean step, without the statistics that only logging steps compute)."""
  config_check.validate(config, num_devices=mesh.devices.size, reads_data=False)
  spe = train.steps_per_epoch(num_records, config.optim.batch_size)
  encoder, tx, schedule, make_state, _ = train.build(config, num_records, mesh)
  state = make_state()
  step = step_lib.jit_on_mesh(
      step_lib.make_train_step(config, encoder, tx, schedule, mesh, spe, statistics=False),
      state,
      mesh,
  )
  return Loop(config, mesh, step, state)


def loop_rate(loop: Loop, batches, steps: int, warmup: int) -> dict:
  """img/s of train.pretrain's loop, `state, metrics = step(state, parallel.global_batch(
  next(batches), mesh))`, over `steps` steps after `warmup` (at least 1) untimed ones.

  Returns a row: img_per_s, step_ms (wall time per step), loss (the last step's).
  """
  state = loop.state
  for _ in range(max(1, warmup)):
    state, metrics = loop.step(state, parallel.global_batch(next(batches), loop.mesh))
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(steps):
    state, metrics = loop.step(state, parallel.global_batch(next(batches), loop.mesh))
  jax.block_until_ready((state, metrics))
  seconds = (time.perf_counter() - start) / steps
  loop.state = state
  return {
      "img_per_s": round(loop.config.optim.batch_size / seconds, 1),
      "step_ms": round(1e3 * seconds, 1),
      "loss": float(metrics["loss"]),
  }


def _cycle(items: list):
  while True:
    yield from items


def worker_counts(config, cpus: int | None = None) -> list[int]:
  """0, then 1, 2, 4, ... up to the CPU count, the CPU count, and config.data.workers where
  it is below it (more worker processes than cores cannot decode faster)."""
  cpus = cpus or os.cpu_count() or 1
  counts, n = {0, cpus, min(config.data.workers, cpus)}, 1
  while n < cpus:
    counts.add(n)
    n *= 2
  return sorted(counts)


def measure(
    config,
    root: str,
    *,
    steps: int,
    warmup: int,
    pipeline_workers: list[int] | None = None,
    loop_workers: list[int] | None = None,
    pipeline_images: int = 768,
    compare_images: int = 32,
    mesh=None,
) -> dict:
  """Every measurement of this module on the JPEG folder `root` (make_jpeg_folder's layout).

  Returns a dict: setup (words); folder (images, KB); decode_ms (decode_ms of compare_images
  files); view_difference (per reduced mode, view_difference over compare_images images);
  same_as_exact (the reduced modes that reduce no image of the folder, which are not timed);
  pipeline (a pipeline_rate row, with its decode, per timed mode and count of
  pipeline_workers, default worker_counts; at least pipeline_images images timed);
  compile_s; global_batch; memory (loop_rate rows of the loop on two batches held in memory:
  one before the JPEG loops and one after each); loop (a loop_rate row per timed mode and
  count of loop_workers, default 0 and the CPU count, with its decode, memory_img_per_s (the
  mean img/s of the in-memory runs just before and just after it) and ratio = its img/s /
  memory_img_per_s). The loop runs on `mesh` (default: all devices, as train.pretrain's).
  """
  load = os.getloadavg()[0]
  if config.nonsemantic.enabled and config.nonsemantic.kind == "texture":
    raise ValueError("texture negatives read texture images, which the JPEG folder lacks")
  batch = config.optim.batch_size
  modes = sources(root, config)
  files = modes["exact"].files
  if len(files) < batch:
    raise ValueError(f"the folder's {len(files)} images are fewer than a batch of {batch}")
  # A reduced decoding that reduces no image of the folder is the exact one: not timed again.
  same = [mode for mode, source in modes.items() if mode != "exact" and not reduces(source)]
  timed = {mode: source for mode, source in modes.items() if mode not in same}
  sizes_kb = [os.path.getsize(f) / 1024 for f in files]
  compare = list(range(0, len(files), max(1, len(files) // compare_images)))[:compare_images]
  out = {
      "folder": {
          "root": root,
          "images": len(files),
          "mean_kb": round(float(np.mean(sizes_kb)), 1),
          "min_kb": round(float(np.min(sizes_kb)), 1),
          "max_kb": round(float(np.max(sizes_kb)), 1),
      },
      "decode_ms": decode_ms([files[i] for i in compare]),
      "view_difference": {
          mode: view_difference(modes["exact"], source, compare)
          for mode, source in modes.items()
          if source.view_size is not None
      },
      "same_as_exact": same,
  }
  batches = max(3, math.ceil(pipeline_images / batch))
  counts = worker_counts(config) if pipeline_workers is None else pipeline_workers
  out["pipeline"] = [
      {"decode": mode, **pipeline_rate(source, config, w, batches)}
      for mode, source in timed.items()
      for w in counts
  ]

  mesh = parallel.make_mesh() if mesh is None else mesh
  loop = make_loop(config, len(files), mesh)
  it = pipeline.make_iterator(train.pretrain_data(config, modes["exact"]), 0)
  try:
    held = [next(it), next(it)]
  finally:
    it.close()
  start = time.perf_counter()
  loop.state, _ = loop.step(loop.state, parallel.global_batch(held[0], mesh))
  jax.block_until_ready(loop.state)
  out["compile_s"] = round(time.perf_counter() - start, 1)
  out["global_batch"] = batch
  # The in-memory loop runs before the first JPEG loop and after each one; each JPEG loop is
  # compared with the two runs beside it, so that other work slowing the machine for a while
  # (which the spread of the in-memory runs shows) weighs on both sides of its ratio.
  out["memory"] = [loop_rate(loop, _cycle(held), steps, warmup)]
  cpus = os.cpu_count() or 1
  out["loop"] = []
  for mode, source in timed.items():
    for w in sorted({0, cpus}) if loop_workers is None else loop_workers:
      it = pipeline.make_iterator(train.pretrain_data(config, source), w)
      try:
        row = {"decode": mode, "workers": w, **loop_rate(loop, it, steps, max(warmup, w + 1))}
      finally:
        it.close()
      out["memory"].append(loop_rate(loop, _cycle(held), steps, warmup))
      beside = (out["memory"][-2]["img_per_s"] + out["memory"][-1]["img_per_s"]) / 2
      row["memory_img_per_s"] = round(beside, 1)
      row["ratio"] = round(row["img_per_s"] / beside, 3)
      out["loop"].append(row)
  scale = tuple(config.data.crop_scale)
  out["setup"] = (
      f"{config.method}: {config.model.depth}-layer ResNet, {config.data.image_size} px views "
      f"(crop scale {scale[0]:g}-{scale[1]:g}), {config.model.dtype}, global batch {batch}, "
      f"NS {'on' if config.nonsemantic.enabled else 'off'}; {mesh.devices.size} "
      f"{jax.devices()[0].device_kind} device(s), {cpus} CPUs (load average {load:.1f} at "
      "the start)"
  )
  return out


def _memory_rate(out: dict) -> float:
  """The in-memory loop's img/s: the median of its runs."""
  return float(np.median([r["img_per_s"] for r in out["memory"]]))


def verdict(out: dict) -> str:
  """The fastest loop of a faithful decoding (exact or reduced) and, where it falls short of
  the in-memory loop, by how much and what would close the gap."""
  faithful = [r for r in out["loop"] if r["decode"] in FAITHFUL]
  best = max(faithful, key=lambda r: r["ratio"])
  memory = best["memory_img_per_s"]
  line = (
      f"fastest faithful: {best['decode']} decoding, {best['workers']} workers, "
      f"{best['img_per_s']:.1f} img/s = {best['ratio']:.3f} x the in-memory loop beside it"
  )
  if best["ratio"] >= 0.95:
    return line + ": the pipeline keeps up with the step"
  alone = [r for r in out["pipeline"] if r["decode"] == best["decode"]]
  per_process = max(r["img_per_s_per_worker"] for r in alone)
  fastest = max(r["img_per_s"] for r in alone)
  serial = 1 / (1 / memory + 1 / fastest)
  return line + (
      f", {memory - best['img_per_s']:.1f} img/s short of {memory:.1f}. At {per_process:.1f} "
      f"img/s per decoding process, feeding the step takes {memory / per_process:.2f} cores "
      f"that the step does not use; where the step keeps every core busy, the pipeline's time "
      f"adds to the step's: 1 / (1/{memory:.1f} + 1/{fastest:.1f}) = {serial:.1f} img/s"
  )


def table(out: dict) -> str:
  """The measurements as text: folder, decode and view-difference lines, the pipeline's and
  the loop's tables, the ratio's definition and the verdict."""
  folder = out["folder"]
  lines = [
      out["setup"],
      f"JPEG folder: {folder['images']} images, {folder['mean_kb']:.0f} KB mean "
      f"({folder['min_kb']:.0f}-{folder['max_kb']:.0f}), {folder['root']}",
      "decode ms/image (PIL; DCT-domain reduction 1/k): "
      + ", ".join(f"1/{k} {ms:.2f}" for k, ms in out["decode_ms"].items()),
  ]
  for mode, v in out["view_difference"].items():
    shift = "n/a" if v["shift_1px"] is None else f"{v['shift_1px']:.2f}"
    lines.append(
        f"{mode} (margin {DECODES[mode]:g}): mean reduction {v['mean_reduction']:.2f}; views "
        f"differ from exact decoding's by {v['mean_abs']:.2f} grey levels (mean absolute; "
        f"moving the crop by 1 source pixel: {shift})"
    )
  for mode in out["same_as_exact"]:
    lines.append(f"{mode}: reduces no image at this view size and crop scale, the same as exact")
  lines += [
      "",
      "input pipeline alone",
      f"{'decode':<12} {'workers':>7} {'img/s':>9} {'img/s/worker':>13} {'start-up s':>11}",
  ]
  for r in out["pipeline"]:
    lines.append(
        f"{r['decode']:<12} {r['workers']:>7} {r['img_per_s']:>9.1f} "
        f"{r['img_per_s_per_worker']:>13.1f} {r['startup_s']:>11.2f}"
    )
  runs = [r["img_per_s"] for r in out["memory"]]
  memory = _memory_rate(out)
  lines += [
      "",
      f"training loop (compile {out['compile_s']:.1f} s)",
      f"{'input':<17} {'workers':>7} {'step ms':>9} {'img/s':>9} {'in-memory img/s':>16} "
      f"{'ratio':>7}",
      f"{'in memory':<17} {'':>7} {1e3 * out['global_batch'] / memory:>9.1f} {memory:>9.1f} "
      f"{'':>16} {'':>7}",
  ]
  for r in out["loop"]:
    lines.append(
        f"{'jpeg ' + r['decode']:<17} {r['workers']:>7} {r['step_ms']:>9.1f} "
        f"{r['img_per_s']:>9.1f} {r['memory_img_per_s']:>16.1f} {r['ratio']:>7.3f}"
    )
  lines.append(
      f"in-memory loop: median of {len(runs)} runs, one before the JPEG loops and one after "
      f"each, {min(runs):.1f}-{max(runs):.1f} img/s"
  )
  if max(runs) - min(runs) > 0.1 * memory:
    lines.append(
        "note: the in-memory runs spread by more than 10%: other work competed for the cores; "
        "each ratio compares a JPEG loop with the in-memory runs just before and after it"
    )
  lines += [
      "ratio = JPEG loop img/s / in-memory loop img/s (the mean of the runs beside it)",
      verdict(out),
  ]
  return "\n".join(lines)


def run(
    config,
    *,
    jpeg_dir: str = "",
    jpeg_images: int = 512,
    steps: int = 10,
    warmup: int = 2,
    as_json: bool = False,
    **kwargs,
) -> dict:
  """The --input=jpeg command: makes (or reuses) the folder, measures (kwargs go to
  `measure`), prints the tables (or one JSON object with as_json) and returns the
  measurements."""
  root = jpeg_dir or default_root(jpeg_images, seed=0)
  start = time.perf_counter()
  make_jpeg_folder(root, jpeg_images, seed=0)
  made_s = time.perf_counter() - start
  out = measure(config, root, steps=steps, warmup=warmup, **kwargs)
  out["folder"]["ready_s"] = round(made_s, 1)
  print(json.dumps(out) if as_json else table(out), flush=True)
  return out
