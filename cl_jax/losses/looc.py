"""The leave-one-out contrastive loss of LooC (Xiao et al. 2021, Sec. 3, Eq. 2).

The query view q and n + 1 key views k_0..k_n of each image are embedded by n + 1
heads into spaces Z_0..Z_n. Key k_0 shares no augmentation parameter with q; key
k_i (i >= 1) copies the parameters of atomic augmentation i from q. Head 0 is
invariant to every augmentation (plain MoCo); head i is invariant to all but
augmentation i, so in Z_i only k_i is a positive and the other keys of the same
image, which differ from q in augmentation i, are extra negatives:

  L_q = -1/(n+1) ( log E00+ / (E00+ + sum_{k-} E00-)
                   + sum_{i>=1} log Eii+ / (sum_{j=0..n} Eij+ + sum_{k-} Eii-) )   (Eq. 2)

with E_ij^+ = exp(z_i^q . z_i^{k_j} / T) (same image) and E_ii^- = exp(z_i^q . n / T)
over the K keys n of head i's own queue. The sum over j includes j = i, the
positive itself.
"""

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from cl_jax.losses import contrast as contrast_lib
from cl_jax.losses import moco
from cl_jax.losses.queue_contrast import SCORE_PRECISION


def looc_loss(
    q: jax.Array,
    k: jax.Array,
    queue: jax.Array,
    temperature: float,
    mesh: Mesh,
    score_queries: int = 0,
) -> tuple[jax.Array, dict]:
  """Eq. 2, averaged over the B queries of the global batch.

  Args:
    q: (B, H, d) unit query embeddings of the H = n + 1 heads, with gradient.
    k: (B, H, V, d) unit key embeddings without gradient, k[b, i, j] = z_i^{k_j}
      (head i, key view j); V = H (key views k_0..k_n).
    queue: (K, H, d) unit queued keys, queue[:, i] head i's queue, rows sharded
      over the mesh's `data` axis.
    temperature: T > 0.
    mesh: the device mesh.
    score_queries: statistics over the first n queries (0: all).

  Returns:
    (loss, stats). stats (similarities before the temperature, no gradient):
    pos_mean, neg_mean, neg_var of head 0 against its queue (as moco_loss's);
    looc/loss_head<i>: head i's term of Eq. 2; looc/pos_head<i>: mean z_i^q . z_i^{k_i};
    looc/same_head<i> (i >= 1): mean z_i^q . z_i^{k_j} over the same-image keys j != i.
  """
  batch, heads, dim = q.shape
  if k.shape != (batch, heads, heads, dim):
    raise ValueError(
        f"k must hold every head's embedding of every key view, shape (B, H, H, d) = "
        f"{(batch, heads, heads, dim)}, got {k.shape}"
    )
  if queue.shape[1:] != (heads, dim):
    raise ValueError(
        f"queue must have shape (K, H, d) with (H, d) = {(heads, dim)}, got {queue.shape}"
    )
  k = jax.lax.stop_gradient(k)
  n = score_queries or batch
  losses, stats = [], {}
  for i in range(heads):
    qi = q[:, i]
    c = moco.moco_contrast(qi, k[:, i, i], [(queue[:, i], None)], temperature, mesh)
    if i > 0:
      others = [j for j in range(heads) if j != i]
      same = jnp.einsum(
          "bd,bjd->bj", qi, k[:, i, jnp.asarray(others)], precision=SCORE_PRECISION
      ).astype(jnp.float32)
      c = contrast_lib.with_extra(c, same, lambda s: s / temperature, f"looc/same_head{i}")
    losses.append(contrast_lib.info_nce(c, temperature))
    head = contrast_lib.contrast_stats(c, n)
    stats[f"looc/loss_head{i}"] = losses[-1]
    stats[f"looc/pos_head{i}"] = head["pos_mean"]
    if i == 0:
      stats.update(head)  # pos_mean, neg_mean, neg_var
    else:
      stats[f"looc/same_head{i}"] = head[f"looc/same_head{i}"]
  return sum(losses) / heads, jax.lax.stop_gradient(stats)
