"""Histograms of the query's cosine similarities to its pairs (Ge et al. 2021, Figs. 2-3).

For a checkpoint, K batches of the pretraining stream are cropped (host
pipeline) and photometrically augmented as in training. With q_i the online
encoder's unit feature of view 1 and the target (EMA) encoder's unit features
k_i of view 2, queue_j of the state's queue and t_im of M patch-based
non-semantic images of view 1 (Sec. 2.3), the similarities, before the
temperature, are

  positive     s_i    = q_i . k_i                    (B per batch)
  negative     s_ij   = q_i . queue_j                (B K per batch)
  non-semantic s_im   = q_i . t_im                   (B M per batch)

Both encoders run in evaluation mode (running batch-norm statistics). The NS
images use the config's `nonsemantic` patch sizes and M even when the run did
not train with them. Each kind is drawn as a density histogram over [-1, 1].
"""

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from matplotlib.figure import Figure

from cl_jax import train
from cl_jax.addons import nonsemantic
from cl_jax.data import photometric, sources
from cl_jax.runtime import checkpoint, parallel, run_config, workdir_lock

KINDS = ("positive", "negative", "non-semantic")


class NoCheckpoint(FileNotFoundError):
  """The run has not saved a checkpoint yet."""


class Tally(NamedTuple):
  """Running histogram of one kind: counts (num_bins,) int64 over fixed bin edges,
  total = sum of the values, n = number of values."""

  counts: np.ndarray
  total: float
  n: int


def pair_similarities(
    q: jax.Array, k: jax.Array, queue: jax.Array, t: jax.Array
) -> dict[str, jax.Array]:
  """Cosine similarities of unit queries with their pairs.

  Args:
    q: (B, d) unit queries; k: (B, d) unit keys of the other view;
    queue: (K, d) unit queued keys; t: (B, M, d) unit NS keys.
  Returns:
    {"positive": (B,) q_i.k_i, "negative": (B K,) q_i.queue_j (row-major in i, j),
     "non-semantic": (B M,) q_i.t_im}, float32.
  """
  return {
      "positive": jnp.sum(q * k, axis=1),
      "negative": (q @ queue.T).reshape(-1),
      "non-semantic": jnp.einsum("bd,bmd->bm", q, t).reshape(-1),
  }


def tally(previous: Tally | None, values: np.ndarray, edges: np.ndarray) -> Tally:
  """`previous` plus the values (any shape) binned over `edges` ((num_bins + 1,) ascending).

  Values are clipped into [edges[0], edges[-1]] first: a cosine of unit vectors
  can exceed 1 by float round-off, and np.histogram would drop it.
  """
  values = np.asarray(values, dtype=np.float64).reshape(-1)
  counts, _ = np.histogram(np.clip(values, edges[0], edges[-1]), edges)
  if previous is None:
    return Tally(counts.astype(np.int64), float(values.sum()), values.size)
  return Tally(
      previous.counts + counts, previous.total + float(values.sum()), previous.n + values.size
  )


def density(t: Tally, edges: np.ndarray) -> np.ndarray:
  """(num_bins,) probability density: counts / (n * bin width); integrates to 1."""
  return t.counts / (t.n * np.diff(edges))


def _similarity_fn(encoder, spec: photometric.PhotometricSpec, ns: ml_collections.ConfigDict):
  """jit: (state, view1, view2 (B, S, S, 3) uint8, rng) -> pair_similarities."""

  @jax.jit
  def similarities(state, view1, view2, rng):
    r1, r2, r_ns = jax.random.split(rng, 3)
    x1, _ = photometric.augment_batch(r1, view1, spec)
    x2, _ = photometric.augment_batch(r2, view2, spec)
    online = {"params": state.params, "batch_stats": state.batch_stats}
    target = (
        online
        if state.target_params is None
        else {"params": state.target_params, "batch_stats": state.target_batch_stats}
    )
    q = encoder.apply(online, x1, train=False)["z"]
    k = encoder.apply(target, x2, train=False)["z"]
    images = nonsemantic.patch_negatives(r_ns, x1, ns.num_ns, ns.patch_min, ns.patch_max)
    t = encoder.apply(target, images.reshape((-1,) + x1.shape[1:]), train=False)["z"]
    # Without a queue (SimCLR, BYOL, SimSiam) the negatives are the other
    # images' second views, SimCLR's cross-view negatives.
    negatives = k if state.queue is None else state.queue
    if negatives.ndim == 3:  # LooC's per-head queues: head 0 is the MoCo head of z
      negatives = negatives[:, 0]
    sims = pair_similarities(q, k, negatives, t.reshape(x1.shape[0], ns.num_ns, -1))
    if state.queue is None:
      b = q.shape[0]
      off_diagonal = ~jnp.eye(b, dtype=bool).reshape(-1)
      sims["negative"] = sims["negative"][jnp.nonzero(off_diagonal, size=b * (b - 1))[0]]
    return sims

  return similarities


def collect(
    workdir: str, step: int | None, batches: int, num_bins: int = 100
) -> tuple[int, np.ndarray, dict[str, Tally]]:
  """Similarity histograms of the checkpoint at `step` (None: the latest) of a run.

  The first `batches` global batches of the run's pretraining stream (its seed)
  are used; the augmentation and patch rngs derive from the run's seed.

  Returns:
    (checkpoint step, bin edges (num_bins + 1,) over [-1, 1], {kind: Tally} for KINDS).
  Raises:
    NoCheckpoint: the run has no checkpoint at all.
    FileNotFoundError: it has none at `step`.
    ValueError: batches < 1 or num_bins < 1.
  """
  if batches < 1 or num_bins < 1:
    raise ValueError(
        f"need at least one batch and one bin; got batches={batches}, " f"num_bins={num_bins}"
    )
  config = run_config.read(workdir)
  workdir_lock.note_if_training(workdir, step)
  manager = checkpoint.make_manager(workdir, read_only=True)
  if not manager.all_steps():
    raise NoCheckpoint(f"{workdir} holds no checkpoint")
  mesh = parallel.make_mesh(jax.devices()[:1])
  source = sources.open_source(config.data, "pretrain")
  built = train.build(config, len(source), mesh)
  encoder, make_state = built.encoder, built.make_state
  state, _ = checkpoint.restore(manager, jax.eval_shape(make_state), step)
  data = train.pretrain_data(config, source)
  similarities = _similarity_fn(encoder, photometric.config_spec(config), config.nonsemantic)
  edges = np.linspace(-1.0, 1.0, num_bins + 1)
  tallies: dict[str, Tally | None] = dict.fromkeys(KINDS)
  rng = jax.random.key(config.seed)
  for i in range(batches):
    batch = data[i]
    sims = jax.device_get(
        similarities(state, batch["view1"], batch["view2"], jax.random.fold_in(rng, i))
    )
    tallies = {kind: tally(tallies[kind], sims[kind], edges) for kind in KINDS}
  return int(state.step), edges, tallies


def plot_similarity_histograms(
    edges: np.ndarray,
    tallies: Mapping[str, Tally],
    run_name: str,
    step: int,
    ns: ml_collections.ConfigDict,
    queue: bool = True,
) -> Figure:
  """Overlaid density histograms of the KINDS, each labelled with its mean similarity.

  Args:
    edges: (num_bins + 1,) bin edges; tallies: {kind: Tally} for KINDS.
    run_name, step: the run and checkpoint, for the title.
    ns: the run's `nonsemantic` config block (patch sizes, M, whether training used them).
    queue: the negatives are the MoCo queue (False: the other images' second views).
  """
  used = "used in training" if ns.enabled else "not used in training"
  title = (
      f"{run_name}, step {step}: similarities of query features\n"
      f"NS = patch NS images of the query view, d ~ U{{{ns.patch_min}..{ns.patch_max}}}, "
      f"M = {ns.num_ns} per query ({used})"
  )
  fig = Figure(figsize=(8.0, 4.8), layout="constrained")
  ax = fig.subplots()
  names = {
      "positive": "positive  q·k+",
      "negative": "negative  q·queue" if queue else "negative  q·k_j, j ≠ i",
      "non-semantic": "patch NS  q·t",
  }
  for i, kind in enumerate(KINDS):
    t = tallies[kind]
    ax.stairs(density(t, edges), edges, fill=True, alpha=0.35, color=f"C{i}")
    ax.stairs(
        density(t, edges),
        edges,
        color=f"C{i}",
        linewidth=1.2,
        label=f"{names[kind]}  (mean {t.total / t.n:.3f}, n={t.n})",
    )
  ax.set_xlim(edges[0], edges[-1])
  ax.set_xlabel("cosine similarity with the query (before temperature)")
  ax.set_ylabel("density")
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=9, loc="upper left")
  ax.grid(alpha=0.3)
  return fig
