"""grain input pipelines: two-view pretraining batches and probe batches.

The host does what needs the full-resolution image: decoding (inside the
source) and the geometric part of the augmentation (random resized crop and
flip, cl_jax.data.geometric). Photometric ops run batched on the device
(cl_jax.data.photometric) inside the train step.

The global stream of examples (shuffle, repeat, crops) is the same for any
number of processes; process p of P reads and crops only rows
[p B/P, (p+1) B/P) of every global batch of B, the rows its devices hold. So a
run on P hosts sees exactly the global batches of a run on one host. Every
random choice is a function of (seed, epoch, position in the stream), so the
iterator state saved in a checkpoint resumes the exact same stream.
"""

import functools
import os
import signal

import grain
import numpy as np

from cl_jax.data import fast_views, geometric, gpu_views, texture_source
from cl_jax.runtime import child_processes


def _views(
    image_size: int, crop_scale: tuple[float, float], num_views: int, texture: bool, decoder: str
):
  crop = fast_views.apply_crop if decoder == "fast" else geometric.apply_crop

  def transform(record: dict, rng: np.random.Generator) -> dict:
    image = record["image"]
    out = {}
    for v in range(1, num_views + 1):
      params = geometric.sample_crop(rng, image.shape[0], image.shape[1], scale=crop_scale)
      out[f"view{v}"] = crop(image, params, image_size)
      out[f"box{v}"] = params.box
      out[f"flip{v}"] = np.bool_(params.flip)
      if texture and v <= 2:
        texture_image = record[texture_source.KEY]
        out[f"texture{v}"] = geometric.apply_crop(
            texture_image, texture_crop(params, image.shape, texture_image.shape), image_size
        )
    return out

  return transform


def texture_crop(
    params: geometric.CropParams, image_shape: tuple, texture_shape: tuple
) -> geometric.CropParams:
  """A view's crop moved onto the image's texture version (Ge et al. 2021, Sec. 2.2: the
  texture image receives its view's augmentation parameters): the same box relative to the
  image size, scaled to the texture's (H_t, W_t), and the same flip."""
  scale = np.array(
      [texture_shape[0] / image_shape[0], texture_shape[1] / image_shape[1]] * 2, np.float32
  )
  return geometric.CropParams(box=params.box * scale, flip=params.flip)


def pretrain_dataset(
    source,
    *,
    batch_size: int,
    image_size: int,
    crop_scale: tuple[float, float],
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_views: int = 2,
    texture: bool = False,
    decoder: str = "pil",
) -> grain.MapDataset:
  """Infinite dataset of this process's rows of the global pretraining batches.

  Each element: view1..view<V> (b, S, S, 3) uint8 randomly cropped and flipped, each
  with its own crop (V = num_views: 2, or 2 + n for LooC's extra keys k_1..k_n);
  box1..box<V> (b, 4) float32 crop boxes [y0, x0, y1, x1] in source pixels;
  flip1..flip<V> (b,) bool; b = batch_size // process_count. With texture=True
  (the source's records hold a texture image, cl_jax.data.texture_source)
  also texture1, texture2 (b, S, S, 3) uint8: each view's crop and flip applied
  to the texture image (texture_crop). The first two views are drawn exactly as
  without the others. Element n holds
  examples [n B + p b, n B + (p+1) b) of the global stream (B = batch_size,
  p = process_index). Records are reshuffled every epoch; the last incomplete
  batch of an epoch is not dropped but continues into the next epoch (the
  stream is one infinite sequence). decoder "fast" resamples the views with
  fast_views.apply_crop (the texture images' views stay geometric.apply_crop's). decoder
  "gpu" (a source of gpu_views.jpeg_record's) leaves the views to the device
  (gpu_views.DeviceViews): an element holds jpeg (b, L) uint8 and jpeg_size (b,) int32, the
  padded bytes (gpu_views.batch_records), in place of the views, with the same boxes and flips.
  """
  if batch_size % process_count:
    raise ValueError(
        f"global batch {batch_size} is not divisible by the process " f"count {process_count}"
    )
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is outside [0, {process_count})")
  ds = grain.MapDataset.source(source).seed(seed).shuffle().repeat(None)
  if num_views < 2:
    raise ValueError(f"num_views must be at least 2 (query and key), got {num_views}")
  if decoder == "gpu":
    if texture:
      raise ValueError("decoder gpu cannot crop texture images (they are decoded on the host)")
    ds = ds.random_map(
        lambda record, rng: gpu_views.crop_record(record, rng, crop_scale, num_views)
    )
    batch_fn = gpu_views.batch_records
  else:
    ds = ds.random_map(_views(image_size, crop_scale, num_views, texture, decoder))
    batch_fn = None
  # Chunks of b consecutive examples; global batch n is chunks [n P, (n+1) P).
  ds = ds.batch(batch_size // process_count, drop_remainder=True, batch_fn=batch_fn)
  return ds[process_index::process_count]


def _init_worker(parent_pid: int, worker_index: int, worker_count: int) -> None:
  """Input workers leave Ctrl-C to the main process, which stops the run cleanly, and die
  with it whatever kills it (cl_jax.runtime.child_processes)."""
  del worker_index, worker_count
  # A scheduler signals every process of the job: the trainer saves, and the workers must
  # keep feeding it until it closes them (or dies, which kills them).
  for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(stop, signal.SIG_IGN)
  child_processes.die_with_parent(parent_pid)


def make_iterator(ds: grain.MapDataset, workers: int):
  """A checkpointable iterator (get_state / set_state) over `ds`."""
  it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=max(1, workers), prefetch_buffer_size=2))
  if workers > 0:
    it_ds = it_ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers),
        worker_init_fn=functools.partial(_init_worker, os.getpid()),
    )
  return iter(it_ds)


def probe_dataset(
    source,
    label_names: tuple[str, ...],
    *,
    image_size: int,
    eval_crop_fraction: float,
    batch_size: int,
    train_views: bool,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    seed: int = 0,
    epochs: int = 1,
) -> grain.MapDataset:
  """Labelled batches for the linear probe.

  train_views=False: every record once, in order, as its evaluation view
  (resize to image_size / eval_crop_fraction, centre crop); the last batch is
  kept (smaller). train_views=True: `epochs` reshuffled passes of random
  resized crops (scale crop_scale) with flips, full batches only.
  Each element: image (b, S, S, 3) uint8 and one (b,) int32 array per label.
  """

  def eval_view(record):
    out = {k: np.int32(record[k]) for k in label_names}
    out["image"] = geometric.eval_view(record["image"], image_size, eval_crop_fraction)
    return out

  def train_view(record, rng):
    out = {k: np.int32(record[k]) for k in label_names}
    params = geometric.sample_crop(
        rng, record["image"].shape[0], record["image"].shape[1], scale=crop_scale
    )
    out["image"] = geometric.apply_crop(record["image"], params, image_size)
    return out

  ds = grain.MapDataset.source(source)
  if train_views:
    ds = ds.seed(seed).shuffle().repeat(epochs).random_map(train_view)
    return ds.batch(batch_size, drop_remainder=True)
  return ds.map(eval_view).batch(batch_size, drop_remainder=False)
