"""Few-shot suite: N-way K-shot episodes with a prototype classifier on frozen features.

python -m cl_jax.evaluate --workdir=W --evaluator=fewshot [--datasets=flowers102,cub200]
    [--shots=5,10] [--ways=0] [--episodes=10] [--baseline=true] [--data_dir=D]

Xiao et al. 2021 (Sec. 4, Table 2) report 5-shot and 10-shot accuracy on Flowers-102 over 10
trials with a 95% interval, on all 102 categories. An episode (sample_episode) draws `ways`
classes (0: all classes of the support pool), K supports of each from the pool
(cl_jax.evaluators.fine_grained: Flowers-102 train+validation, CUB-200-2011 train), and queries
every test image of those classes; the prototype classifier (prototype_predictions, the
nearest-centroid classifier of Snell et al. 2017 with cosine similarity) labels the queries.
The features of the pool and of the test split are computed once per network, and every
episode indexes them. Episodes are seeded by config.seed and the episode index, so a rerun
draws the same episodes; the K-shot supports of an episode are the first K of one random
order per class, so the 5-shot supports are part of the 10-shot ones and the random-init
baseline (`baseline`) is evaluated on the very same episodes. Per K the report gives the
episodes' accuracies, their mean and the half-width of the 95% interval (interval95).
"""

from typing import NamedTuple

import numpy as np

from cl_jax.evaluators import fine_grained
from cl_jax.runtime.errors import UsageError

TAG = "eval_fewshot"
OPTIONS = ("datasets", "shots", "ways", "episodes", "baseline")

DEFAULT_DATASETS = ("flowers102",)
DEFAULT_SHOTS = (5, 10)
DEFAULT_EPISODES = 10
INTERVAL = (
    "95% normal interval: mean +- 1.96 s / sqrt(episodes), s the sample standard deviation "
    "(ddof=1) of the episodes' accuracies"
)


def _unit(x: np.ndarray) -> np.ndarray:
  """Rows of x (n, D) scaled to unit L2 norm (a zero row stays zero), in float64."""
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def prototype_predictions(
    support: np.ndarray, support_labels: np.ndarray, queries: np.ndarray
) -> np.ndarray:
  """Labels of `queries` (Q, D) by the cosine prototype classifier on `support` (S, D).

  With f the L2-normalised features, f(x) = z / ||z||, and S_c the supports of class c
  (support_labels (S,)), the prototype of c is the mean of its normalised supports
  (Snell et al. 2017, Eq. 1):
      p_c = 1 / |S_c| * sum_{x in S_c} f(x),
  and a query goes to the prototype of highest cosine similarity (in place of Snell et al.'s
  squared Euclidean distance):
      y(q) = argmax_c  f(q) . p_c / ||p_c||.
  Returns (Q,) labels, each one of np.unique(support_labels) (ties: the smallest label).
  """
  classes, which = np.unique(support_labels, return_inverse=True)
  sums = np.zeros((len(classes), support.shape[1]))
  np.add.at(sums, which, _unit(support))
  prototypes = sums / np.bincount(which)[:, None]
  return classes[np.argmax(_unit(queries) @ _unit(prototypes).T, axis=1)]


def interval95(accuracies) -> tuple[float, float]:
  """(mean, half-width 1.96 * s / sqrt(n)) of n >= 2 episode accuracies, s the sample standard
  deviation (ddof=1): the 95% normal interval of the mean accuracy."""
  a = np.asarray(accuracies, np.float64)
  return float(a.mean()), float(1.96 * a.std(ddof=1) / np.sqrt(len(a)))


class Episode(NamedTuple):
  """classes (N,) sorted labels; support (N * K,) pool indices, K per class in class order;
  queries (Q,) increasing test indices: every test image of the N classes."""

  classes: np.ndarray
  support: np.ndarray
  queries: np.ndarray


def sample_episode(
    pool_labels: np.ndarray, test_labels: np.ndarray, ways: int, shots: int, seed: int, index: int
) -> Episode:
  """Episode `index` of a run seeded by `seed`: `ways` distinct classes of the pool (0: all of
  them), the first `shots` of a random order of each class's pool images as supports, and the
  test images of those classes as queries. pool_labels (N,), test_labels (M,) int."""
  rng = np.random.default_rng((seed, index))
  classes = np.unique(pool_labels)
  if ways:
    classes = np.sort(rng.choice(classes, ways, replace=False))
  support = np.concatenate(
      [rng.permutation(np.flatnonzero(pool_labels == c))[:shots] for c in classes]
  )
  return Episode(classes, support, np.flatnonzero(np.isin(test_labels, classes)))


def episode_accuracy(f: fine_grained.Features, episode: Episode) -> float:
  """Fraction of the episode's queries the prototype classifier labels correctly."""
  predicted = prototype_predictions(
      f.x_train[episode.support], f.y_train[episode.support], f.x_test[episode.queries]
  )
  return float(np.mean(predicted == f.y_test[episode.queries]))


def _integers(options: dict, key: str, default) -> tuple[int, ...]:
  """options[key] as integers: comma-separated text, a sequence or one integer."""
  value = options.get(key)
  if value is None:
    value = default
  items = value.split(",") if isinstance(value, str) else np.atleast_1d(value).tolist()
  try:
    return tuple(int(str(v).strip()) for v in items)
  except ValueError:
    raise UsageError(f"--{key} must be integers separated by commas, got {value!r}") from None


def _options(options: dict) -> tuple[tuple[int, ...], int, int]:
  """(shots, ways, episodes), checked where the data does not matter."""
  shots = tuple(sorted(set(_integers(options, "shots", DEFAULT_SHOTS))))
  ways, episodes = (
      _integers(options, k, d) for k, d in (("ways", 0), ("episodes", DEFAULT_EPISODES))
  )
  if not shots or min(shots) < 1:
    raise UsageError(
        f"--shots must list numbers of support images per class, each at least 1 (e.g. 5,10); "
        f"got {options.get('shots')!r}"
    )
  if len(ways) != 1 or ways[0] < 0 or ways[0] == 1:
    raise UsageError(
        f"--ways must be one number of classes per episode, at least 2, or 0 for all classes; "
        f"got {options.get('ways')!r}"
    )
  if len(episodes) != 1 or episodes[0] < 2:
    raise UsageError(
        f"--episodes must be one number, at least 2 (a 95% interval needs the sample standard "
        f"deviation of two or more episodes); got {options.get('episodes')!r}"
    )
  return shots, ways[0], episodes[0]


def check_episodes(dataset: fine_grained.Opened, f: fine_grained.Features, shots, ways) -> int:
  """The number of ways of the episodes (all pool classes for ways 0), after checking that
  `ways` classes with max(shots) pool images each and test images exist."""
  classes, counts = np.unique(f.y_train, return_counts=True)
  pool = f"the {dataset.spec.train_split} pool of {dataset.name}"
  if ways > len(classes):
    raise UsageError(
        f"--ways={ways} exceeds the {len(classes)} classes of {pool}; use at most {len(classes)} "
        "(or 0 for all)"
    )
  if max(shots) > counts.min():
    raise UsageError(
        f"--shots={max(shots)}: class {classes[counts.argmin()]} of {pool} has only "
        f"{counts.min()} images (the fewest of its {len(classes)} classes); use shots of at most "
        f"{counts.min()}"
    )
  untested = np.setdiff1d(classes, f.y_test)
  if untested.size:
    raise UsageError(
        f"classes {untested[:5].tolist()} of {pool} have no {dataset.spec.test_split} images to "
        f"query: {dataset.name} in the data_dir is incomplete; prepare it again"
    )
  return ways or len(classes)


def _evaluate(f: fine_grained.Features, drawn: dict[int, list[Episode]]) -> dict:
  """Per number of shots K ("5", ...): the episodes' accuracies on features f, their mean and
  95% half-width, and the episodes' query counts."""
  out = {}
  for k, episodes in drawn.items():
    accuracies = [episode_accuracy(f, e) for e in episodes]
    mean, half = interval95(accuracies)
    out[str(k)] = {
        "mean": mean,
        "ci95": half,
        "episodes": accuracies,
        "queries": [len(e.queries) for e in episodes],
    }
  return out


def run(ctx) -> dict:
  """The report body: the classifier, ways, episodes and interval used, and per dataset its
  splits, sizes, classes and, per number of shots K (keys "5", "10", ...), "accuracy"
  {"mean", "ci95", "episodes": per-episode accuracies, "queries": per-episode query counts}
  and (with the baseline option) "random_init" alike."""
  names = fine_grained.dataset_names(ctx.options, DEFAULT_DATASETS)
  shots, ways, n = _options(ctx.options)
  baseline = fine_grained.baseline_option(ctx.options)
  datasets = [fine_grained.open_dataset(name, ctx.data_dir) for name in names]
  init = ctx.extractor.init_variables() if baseline else None
  report = {}
  for dataset in datasets:
    f = fine_grained.split_features(ctx, ctx.variables, dataset)
    entry = {
        "tfds": dataset.spec.tfds_name,
        "pool_split": dataset.spec.train_split,
        "test_split": dataset.spec.test_split,
        "num_pool": len(f.y_train),
        "num_test": len(f.y_test),
        "ways": check_episodes(dataset, f, shots, ways),
    }
    drawn = {
        k: [sample_episode(f.y_train, f.y_test, ways, k, ctx.config.seed, e) for e in range(n)]
        for k in shots
    }
    entry["accuracy"] = _evaluate(f, drawn)
    if init is not None:
      entry["random_init"] = _evaluate(fine_grained.split_features(ctx, init, dataset), drawn)
    report[dataset.name] = entry
  return {
      "classifier": "prototype (cosine similarity to the mean normalised support feature)",
      "features": ctx.config.probe.get("features", "backbone"),
      "seed": ctx.config.seed,
      "episodes": n,
      "interval": INTERVAL,
      "datasets": report,
  }


def scalars(report: dict) -> dict[str, float]:
  """fewshot/<dataset>/<K>shot/mean|ci95 and fewshot/<dataset>/<K>shot/random_init/mean|ci95."""
  return fine_grained.dataset_scalars(
      report,
      "fewshot",
      lambda k, summary, infix: [(f"{k}shot/{infix}{s}", summary[s]) for s in ("mean", "ci95")],
  )


def table(report: dict) -> str:
  """Mean accuracy +- the 95% interval per dataset and shots, beside the random init."""
  entries = report["datasets"]
  base = all("random_init" in e for e in entries.values())
  lines = [
      f"few-shot: prototype classifier on frozen {report['features']} features of "
      f"{report['workdir']} at step {report['step']}, {report['episodes']} episodes, "
      "mean +- 95% interval",
      f"  {'dataset':<11} {'ways':>5} {'shots':>5} {'accuracy':>16}"
      + (f" {'random init':>16}" if base else ""),
  ]
  for name, e in entries.items():
    for k, s in e["accuracy"].items():
      line = f"  {name:<11} {e['ways']:>5} {k:>5} {_pm(s):>16}"
      lines.append(line + (f" {_pm(e['random_init'][k]):>16}" if base else ""))
  return "\n".join(lines)


def _pm(summary: dict) -> str:
  return f"{100 * summary['mean']:.2f} +- {100 * summary['ci95']:.2f}%"
