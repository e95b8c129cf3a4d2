"""cl_jax.analysis.fingerprint: a run's components, their canonical tiny configs, the
fingerprint's determinism and its sensitivity to the code a step runs, and the source digest."""

import pytest

from cl_jax import config_check
from cl_jax.analysis import fingerprint
from configs import dicr, mocov2_patchns, mocov2_texturens, simclr


def test_components_name_the_base_step_and_each_addon():
  assert fingerprint.components(mocov2_patchns.get_config(None)) == [
      "moco",
      "moco+nonsemantic_patch",
  ]
  assert fingerprint.components(mocov2_texturens.get_config(None))[1] == (
      "moco+nonsemantic_texture"
  )
  assert fingerprint.components(dicr.get_config("moco")) == [
      "moco_symmetric",
      "moco_symmetric+dicr",
  ]
  c = simclr.get_config(None)
  c.ifm.enabled = True
  assert fingerprint.components(c) == ["simclr", "simclr+ifm"]
  c = mocov2_patchns.get_config(None)
  c.model.bn_mode = "shuffle_stats"
  assert fingerprint.components(c) == ["moco", "moco+shuffle_stats", "moco+nonsemantic_patch"]
  assert fingerprint.components(mocov2_patchns.get_config("imagenet100")) == [
      "moco",
      "moco+imagenet_stem",
      "moco+bfloat16",
      "moco+nonsemantic_patch",
  ]


@pytest.mark.parametrize(
    "component",
    [
        "moco",
        "moco_symmetric+dicr",
        "moco+ft",
        "moco+shuffle_stats",
        "moco+imagenet_stem",
        "moco+bfloat16",
        "simclr+hcl",
        "simclr+nonsemantic_patch",
        "moco+looc",
        "byol",
        "simsiam+dicr",
    ],
)
def test_canonical_configs_are_tiny_valid_and_hold_their_addon_alone(component):
  c = fingerprint.canonical_config(component)
  config_check.validate(c, num_devices=1, reads_data=False)
  dtype = "bfloat16" if component.endswith("+bfloat16") else "float32"
  assert (c.optim.batch_size, c.model.depth, c.model.dtype) == (8, 10, dtype)
  assert fingerprint.components(c) == [component.partition("+")[0]] + (
      [component] if "+" in component else []
  )


@pytest.mark.slow
def test_the_fingerprint_repeats_and_tells_the_code_paths_apart():
  """The same step twice gives the same bits; an add-on's step (patch negatives; DICR, whose
  weight is 0 in the first epoch and on in the last one, where the fingerprint's step is)
  gives other values than its base's."""
  base = fingerprint.step_fingerprint(fingerprint.canonical_config("moco_symmetric"))
  assert base == fingerprint.step_fingerprint(fingerprint.canonical_config("moco_symmetric"))
  with_dicr = fingerprint.step_fingerprint(fingerprint.canonical_config("moco_symmetric+dicr"))
  patch = fingerprint.step_fingerprint(fingerprint.canonical_config("moco+nonsemantic_patch"))
  moco = fingerprint.step_fingerprint(fingerprint.canonical_config("moco"))
  assert with_dicr[0] != base[0] and patch != moco
  # Shuffle-BN by statistics: the same maths as the permuted batch, summed in another order.
  by_statistics = fingerprint.step_fingerprint(fingerprint.canonical_config("moco+shuffle_stats"))
  assert by_statistics == pytest.approx(moco, rel=1e-5)
  # The ImageNet stem (its max-pool's hand-written backward among it) is another network.
  assert fingerprint.step_fingerprint(fingerprint.canonical_config("moco+imagenet_stem")) != moco
  # A bfloat16 network with its views held in bfloat16 rounds differently.
  assert fingerprint.step_fingerprint(fingerprint.canonical_config("moco+bfloat16")) != moco
  assert all(isinstance(v, float) and v > 0 for v in base + with_dicr + patch)
  assert fingerprint.differing({"a": [1.0, 2.0], "b": base}, {"a": [1.0, 2.5]}) == ["a"]


def test_the_source_digest_follows_the_code_and_nothing_else(tmp_path):
  (tmp_path / "cl_jax").mkdir()
  (tmp_path / "configs").mkdir()
  (tmp_path / "cl_jax" / "step.py").write_text("x = 1\n")
  (tmp_path / "configs" / "a.py").write_text("y = 2\n")
  first = fingerprint.source_digest(str(tmp_path))
  (tmp_path / "README.md").write_text("docs\n")
  assert fingerprint.source_digest(str(tmp_path))["sha256"] == first["sha256"]
  (tmp_path / "cl_jax" / "step.py").write_text("x = 2\n")
  assert fingerprint.source_digest(str(tmp_path))["sha256"] != first["sha256"]


def test_the_commit_is_dirty_only_for_changed_source(tmp_path):
  """A commit's records (outside cl_jax/ and configs/) rewritten by a study leave the code
  clean; an edited source file makes it "-dirty"."""
  import subprocess

  def git(*args):
    subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

  (tmp_path / "cl_jax").mkdir()
  (tmp_path / "cl_jax" / "step.py").write_text("x = 1\n")
  (tmp_path / "seed0.json").write_text("{}\n")
  git("init", "-q")
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
  head = subprocess.run(
      ["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
  ).stdout.strip()
  assert fingerprint.source_digest(str(tmp_path))["commit"] == head
  (tmp_path / "seed0.json").write_text('{"a": 1}\n')
  assert fingerprint.source_digest(str(tmp_path))["commit"] == head
  (tmp_path / "cl_jax" / "step.py").write_text("x = 2\n")
  assert fingerprint.source_digest(str(tmp_path))["commit"] == head + "-dirty"
