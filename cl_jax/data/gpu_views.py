"""The GPU path for JPEG folders (``data.decoder="gpu"``): the host reads the files' bytes and
draws the crops, the GPU decodes the crops and resamples the views.

On the host, in grain's workers (shuffling, sharding, the iterator state of a checkpoint: all as
on the CPU paths): the source reads each JPEG's bytes and its header's size (`jpeg_record`, no
decoding); the pipeline draws each view's crop box and flip from that size with the same random
draws as the CPU paths (`crop_record`, geometric.sample_crop), so that a seed gives the same crops
on every path; `batch_records` pads the bytes of a batch into one (b, L) uint8 array. In the
main process, `DeviceViews` turns such a batch into the train step's global batch: on each local
device, nvImageCodec decodes the crop box of each view (a region decode: only the region's
blocks are transformed and colour-converted; the entropy decoding of the scan up to it is still
done) with NVIDIA's nvJPEG (the hardware JPEG engines of an A100/H100/H200 where the image
allows, CUDA kernels otherwise, its CPU backend for what neither decodes); the decoded crops are
copied into one zero-padded canvas per device (`canvas_shape`); `resample` resizes them there.
The views reach the step as device arrays: no pixel goes through the host.

`resample` is the antialiased bilinear resize of the crop (the triangle filter widened by the
downscale factor, PIL's and PyTorch's BILINEAR with antialiasing, `resize_weights`) as two
matrix products per view in float32 (three bfloat16 passes on a GPU, Precision.HIGH), rounded
once: the views of the "fast" path (cl_jax.data.fast_views, PyTorch's uint8 kernel, which rounds
after each axis) within one grey level, but where the two roundings fall either side of a half
(tests/test_gpu_views.py). nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: on a
GPU the decoded pixels themselves differ from PIL's by that decoder's rounding.

On a CPU device (CPU tests, and a check of the path without a GPU) nvImageCodec's CPU backend
(libjpeg-turbo, PIL's pixels) decodes into host memory and the canvas is put on the device.
Needs nvImageCodec (INSTALL; requirements.txt); the config check refuses the path where it or a
GPU is missing (`unavailable`), and for sources that are not JPEG folders.
"""

import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cl_jax.data import geometric, image_folder
from cl_jax.runtime import parallel

INSTALL = "pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg"
JPEG_KEY, SIZE_KEY = "jpeg", "jpeg_size"  # a batch's padded bytes (b, L) and lengths (b,)
CANVAS_STEP = 32  # a canvas side is a multiple of this: few shapes, few compiles of `resample`
BYTES_STEP = 4096  # the padded bytes' length L is a multiple of this
_JPEG_MAGIC = b"\xff\xd8"
# nvImageCodec's extensions this path uses: libjpeg-turbo (CPU) and nvJPEG (GPU). The others
# (TIFF, JPEG 2000, ...) would each print an error at every decoder's creation where their
# NVIDIA libraries are not installed.
_EXTENSIONS = ("libjpeg_turbo_ext", "libnvjpeg_ext")
_CUDA_MEMCPY_DEVICE_TO_DEVICE = 3


def missing_packages() -> list[str]:
  """The packages of this path that are not installed (nvImageCodec's wheel name)."""
  try:
    found = importlib.util.find_spec("nvidia.nvimgcodec") is not None
  except ModuleNotFoundError:
    found = False
  return [] if found else ["nvidia-nvimgcodec-cu13"]


def unavailable() -> str | None:
  """Why this path cannot run here (a package, a GPU or nvJPEG missing), in words, or None."""
  missing = missing_packages()
  if missing:
    return f"it needs {' and '.join(missing)}, not installed here: {INSTALL}"
  if jax.default_backend() != "gpu":
    return f"it decodes on a GPU, and JAX sees none here (its backend is {jax.default_backend()})"
  if _library("nvjpeg") is None:
    return f"it needs NVIDIA's nvJPEG library (libnvjpeg), not found here: {INSTALL}"
  return None


def _library(name: str) -> str | None:
  """The path of NVIDIA's library lib<name>.so from its Python wheel (nvidia/*/lib/), or the
  system's name for it, or None."""
  for base in sys.path:
    found = sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", f"lib{name}.so*")))
    if found:
      return found[0]
  return ctypes.util.find_library(name)


def jpeg_record(data: bytes, path: str) -> dict:
  """{"jpeg": (n,) uint8, the bytes `data` of the JPEG file `path`; "height", "width": its
  stored size, from the header (simplejpeg; nothing is decoded)}.

  Raises:
    image_folder.BadImageError: the file is not a JPEG that libjpeg-turbo reads.
  """
  import simplejpeg

  try:
    if data[:2] != _JPEG_MAGIC:
      raise ValueError("no JPEG start marker")
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
  except ValueError as e:
    raise image_folder.BadImageError(
        f"{path} is not a JPEG ({e}): data.decoder=gpu decodes JPEGs only; save it as a JPEG, "
        "or set data.decoder=fast, which reads any image"
    ) from None
  return {JPEG_KEY: np.frombuffer(data, np.uint8), "height": height, "width": width}


def crop_record(
    record: dict, rng: np.random.Generator, crop_scale: tuple[float, float], num_views: int
) -> dict:
  """The views' crops of a jpeg_record, drawn as the CPU paths draw them (pipeline: for each
  view in turn geometric.sample_crop(rng, height, width, scale=crop_scale), the same draws in
  the same order), so that a seed gives every path the same crops.

  Returns {"jpeg": the bytes, "box<v>": (4,) float32 integer box [y0, x0, y1, x1], "flip<v>":
  bool} for v = 1..num_views.
  """
  out = {JPEG_KEY: record[JPEG_KEY]}
  for v in range(1, num_views + 1):
    params = geometric.sample_crop(rng, record["height"], record["width"], scale=crop_scale)
    out[f"box{v}"] = params.box
    out[f"flip{v}"] = np.bool_(params.flip)
  return out


def batch_records(records: Sequence[dict]) -> dict:
  """grain's batch_fn for crop_record's records: every key stacked, but the bytes, which are
  zero-padded to a common length L (the longest, rounded up to BYTES_STEP) into "jpeg" (b, L)
  uint8, with their lengths in "jpeg_size" (b,) int32."""
  sizes = np.asarray([len(r[JPEG_KEY]) for r in records], np.int32)
  padded = np.zeros((len(records), BYTES_STEP * math.ceil(sizes.max() / BYTES_STEP)), np.uint8)
  for row, record in enumerate(records):
    padded[row, : sizes[row]] = record[JPEG_KEY]
  out = {k: np.stack([r[k] for r in records]) for k in records[0] if k != JPEG_KEY}
  return {**out, JPEG_KEY: padded, SIZE_KEY: sizes}


def resize_weights(lengths: jax.Array, in_size: int, out_size: int) -> jax.Array:
  """The weights of antialiased bilinear resampling of n lines of lengths[i] pixels (held in
  lines of in_size, zero beyond) to out_size pixels, the triangle filter widened by the
  downscale factor (PIL's and PyTorch's BILINEAR with antialiasing):

    w[i, o, j] ∝ max(0, 1 - |j + 1/2 - c| / s),  c = (o + 1/2) L / S,  s = max(1, L / S)

  for 0 <= j < L = lengths[i], 0 beyond (S = out_size), each row normalised to sum 1.

  Args:
    lengths: (n,) int, 1 <= lengths[i] <= in_size.
    in_size, out_size: static sizes.

  Returns:
    (n, out_size, in_size) float32.
  """
  length = lengths.astype(jnp.float32)[:, None, None]
  scale = length / out_size
  centre = (jnp.arange(out_size, dtype=jnp.float32)[None, :, None] + 0.5) * scale
  j = jnp.arange(in_size, dtype=jnp.float32)[None, None, :]
  w = jnp.maximum(0.0, 1.0 - jnp.abs(j + 0.5 - centre) / jnp.maximum(scale, 1.0))
  w = jnp.where(j < length, w, 0.0)
  return w / jnp.sum(w, axis=-1, keepdims=True)


@functools.partial(jax.jit, static_argnames=("size",))
def resample(
    canvas: jax.Array, heights: jax.Array, widths: jax.Array, flips: jax.Array, size: int
) -> jax.Array:
  """Views of the crops on `canvas`, resized by antialiased bilinear resampling.

  Args:
    canvas: (n, H, W, 3) uint8, crop i in its top-left heights[i] x widths[i] pixels.
    heights, widths: (n,) int32 crop sizes.
    flips: (n,) bool, view i mirrored left-right.
    size: the views' side (static).

  Returns:
    (n, size, size, 3) uint8: view[i, o, p] = round(sum_{h, w} wy[i, o, h] wx[i, p', w]
    canvas[i, h, w]) with wy, wx from resize_weights and p' = size - 1 - p where flips[i].
  """
  wy = resize_weights(heights, canvas.shape[1], size)
  wx = resize_weights(widths, canvas.shape[2], size)
  wx = jnp.where(flips[:, None, None], wx[:, ::-1], wx)
  high = jax.lax.Precision.HIGH
  x = jnp.einsum("npw,nhwc->nhpc", wx, canvas.astype(jnp.float32), precision=high)
  x = jnp.einsum("noh,nhpc->nopc", wy, x, precision=high)
  return jnp.clip(jnp.round(x), 0, 255).astype(jnp.uint8)


def canvas_shape(heights: np.ndarray, widths: np.ndarray) -> tuple[int, int, int, int]:
  """(n, H, W, 3): the largest crop of n rounded up to multiples of CANVAS_STEP."""
  side = lambda v: CANVAS_STEP * math.ceil(int(np.max(v)) / CANVAS_STEP)
  return (len(heights), side(heights), side(widths), 3)


def crop_sizes(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(heights, widths) (n,) int32 of integer boxes (n, 4) [y0, x0, y1, x1]."""
  boxes = np.asarray(boxes)
  return (boxes[:, 2] - boxes[:, 0]).astype(np.int32), (boxes[:, 3] - boxes[:, 1]).astype(np.int32)


def _extensions_dir(package_dir: str, names: tuple[str, ...]) -> str:
  """A folder of links to the nvImageCodec extensions `names` of its package folder."""
  folder = os.path.join(tempfile.gettempdir(), f"cl_jax_nvimgcodec_{os.getuid()}_{len(names)}")
  os.makedirs(folder, exist_ok=True)
  for name in names:
    for path in glob.glob(os.path.join(package_dir, "extensions", name + ".so*")):
      link = os.path.join(folder, os.path.basename(path))
      if os.path.realpath(link) != path:
        tmp = f"{link}.{os.getpid()}"
        os.symlink(path, tmp)
        os.replace(tmp, link)
  return folder


def _nvimgcodec():
  """nvImageCodec, its first import made to load only the extensions this path uses
  (libjpeg-turbo's, and nvJPEG's where JAX runs on a GPU), unless NVIMGCODEC_EXTENSIONS_PATH
  is set: it loads its extensions when it is imported, and each one whose NVIDIA library is
  missing (TIFF, JPEG 2000, ...) prints an error."""
  if "nvidia.nvimgcodec" not in sys.modules and "NVIMGCODEC_EXTENSIONS_PATH" not in os.environ:
    spec = importlib.util.find_spec("nvidia.nvimgcodec")
    gpu = jax.default_backend() == "gpu"
    if gpu and _library("nvjpeg"):
      # Loaded first, so that the linked extension (whose search path is relative to the
      # package's own folder) finds it.
      ctypes.CDLL(_library("nvjpeg"), mode=ctypes.RTLD_GLOBAL)
    if spec is not None and spec.origin:
      names = _EXTENSIONS if gpu else _EXTENSIONS[:1]
      folder = _extensions_dir(os.path.dirname(spec.origin), names)
      os.environ["NVIMGCODEC_EXTENSIONS_PATH"] = folder
  from nvidia import nvimgcodec

  return nvimgcodec


def make_decoder(device):
  """An nvImageCodec decoder for the JAX device `device`: on its GPU (nvJPEG's hardware engines
  and CUDA decoders, the CPU backend for the rest) or, for a CPU device, the CPU backend alone,
  decoding into host memory."""
  nvimgcodec = _nvimgcodec()
  if device.platform == "gpu":
    return nvimgcodec.Decoder(device_id=device.local_hardware_id)
  return nvimgcodec.Decoder(
      device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
      backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
  )


def decode_crops(decoder, jpeg: np.ndarray, sizes: np.ndarray, boxes: np.ndarray) -> list:
  """The crops boxes[i] (integer [y0, x0, y1, x1]) of the JPEGs jpeg[i, :sizes[i]], decoded
  as RGB by `decoder` in one batch (region decodes, stored orientation as PIL's: no EXIF
  rotation). Returns nvImageCodec images of (y1 - y0, x1 - x0, 3) uint8.

  Raises:
    ValueError: a JPEG of the batch cannot be decoded (named by row and box).
  """
  nvimgcodec = _nvimgcodec()
  streams = []
  for row, (data, size, box) in enumerate(zip(jpeg, sizes, boxes.astype(np.int64))):
    region = nvimgcodec.Region(int(box[0]), int(box[1]), int(box[2]), int(box[3]))
    stream = nvimgcodec.CodeStream(data[:size].tobytes())
    streams.append(stream.get_sub_code_stream(region=region))
  params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.SRGB)
  images = decoder.decode(streams, params=params)
  for row, image in enumerate(images):
    if image is None:
      raise ValueError(
          f"nvImageCodec could not decode the JPEG of batch row {row} (crop box "
          f"{boxes[row].tolist()}): run with data.decoder=fast, which names the file"
      )
  return images


def _cudart():
  """The CUDA runtime library (libcudart) that JAX's CUDA wheels or the system provide."""
  path = _library("cudart")
  if path is None:
    raise RuntimeError("data.decoder=gpu: no CUDA runtime (libcudart) found; install jax[cuda13]")
  return ctypes.CDLL(path)


def fill_canvas(images: list, shape: tuple, device) -> jax.Array:
  """The decoded crops `images` in the top-left corners of a zero (n, H, W, 3) uint8 array on
  `device`: host images put there through a NumPy canvas; device images (nvImageCodec's GPU
  output) copied on the GPU into a new device array before any computation reads it (CUDA's
  cudaMemcpy2D on the decoder's default stream, waited for)."""
  nvimgcodec = _nvimgcodec()
  if images[0].buffer_kind == nvimgcodec.ImageBufferKind.STRIDED_HOST:
    canvas = np.zeros(shape, np.uint8)
    for row, image in enumerate(images):
      pixels = np.asarray(image)
      canvas[row, : pixels.shape[0], : pixels.shape[1]] = pixels
    return jax.device_put(canvas, device)
  canvas = jnp.zeros(shape, jnp.uint8, device=device)
  canvas.block_until_ready()
  cudart = _cudart()
  cudart.cudaSetDevice(device.local_hardware_id)
  base, row_pitch = canvas.unsafe_buffer_pointer(), shape[2] * 3
  for row, image in enumerate(images):
    interface = image.__cuda_array_interface__
    height, width, _ = interface["shape"]
    strides = interface.get("strides") or (width * 3, 3, 1)
    status = cudart.cudaMemcpy2DAsync(
        ctypes.c_void_p(base + row * shape[1] * row_pitch),
        ctypes.c_size_t(row_pitch),
        ctypes.c_void_p(interface["data"][0]),
        ctypes.c_size_t(strides[0]),
        ctypes.c_size_t(width * 3),
        ctypes.c_size_t(height),
        ctypes.c_int(_CUDA_MEMCPY_DEVICE_TO_DEVICE),
        ctypes.c_void_p(0),
    )
    if status:
      raise RuntimeError(f"data.decoder=gpu: cudaMemcpy2DAsync failed with CUDA error {status}")
  status = cudart.cudaStreamSynchronize(ctypes.c_void_p(0))
  if status:
    raise RuntimeError(f"data.decoder=gpu: cudaStreamSynchronize failed with CUDA error {status}")
  return canvas


class DeviceViews:
  """The train step's global batch from this process's batch of the "gpu" pipeline (its rows
  of the global batch, batch_records' keys): each local device decodes and resamples the views
  of the rows it holds; the other keys go to the devices as parallel.global_batch puts them.

  Args:
    mesh: the run's mesh (its batch sharding decides which rows each device holds).
    image_size: the views' side S.
    num_views: V; the batch has box1..boxV and flip1..flipV, and gets view1..viewV
      (B, S, S, 3) uint8.
  """

  def __init__(self, mesh, image_size: int, num_views: int):
    self.mesh, self.image_size, self.num_views = mesh, image_size, num_views
    self.sharding = parallel.batch_sharding(mesh)
    self.devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    self.decoders = {d: make_decoder(d) for d in self.devices}

  def _rows(self, local_rows: int) -> dict:
    """{device: slice of this process's rows it holds}."""
    total = local_rows * jax.process_count()
    spans = {
        d: index[0].indices(total)[:2]
        for d, index in self.sharding.addressable_devices_indices_map((total,)).items()
    }
    offset = min(start for start, _ in spans.values())
    return {d: slice(start - offset, stop - offset) for d, (start, stop) in spans.items()}

  def __call__(self, local: dict) -> dict:
    jpeg, sizes = local[JPEG_KEY], local[SIZE_KEY]
    rest = {k: v for k, v in local.items() if k not in (JPEG_KEY, SIZE_KEY)}
    out = parallel.global_batch(rest, self.mesh)
    total = len(jpeg) * jax.process_count()
    shape = (total, self.image_size, self.image_size, 3)
    per_device = {v: [] for v in range(1, self.num_views + 1)}
    rows = self._rows(len(jpeg))
    for device in self.devices:
      r = rows[device]
      boxes = np.concatenate([local[f"box{v}"][r] for v in per_device])
      flips = np.concatenate([local[f"flip{v}"][r] for v in per_device])
      repeat = lambda a: np.concatenate([a[r]] * self.num_views)
      images = decode_crops(self.decoders[device], repeat(jpeg), repeat(sizes), boxes)
      heights, widths = crop_sizes(boxes)
      canvas = fill_canvas(images, canvas_shape(heights, widths), device)
      put = lambda a: jax.device_put(a, device)
      views = resample(canvas, put(heights), put(widths), put(flips), self.image_size)
      n = r.stop - r.start
      for v in per_device:
        per_device[v].append(views[(v - 1) * n : v * n])
    for v, arrays in per_device.items():
      out[f"view{v}"] = jax.make_array_from_single_device_arrays(shape, self.sharding, arrays)
    return out
