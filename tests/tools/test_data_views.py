"""Data loaders (digits, .npz, image folder, CIFAR-10 root), the stratified split, and the
seeded two-view augmentation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from moco_ref.core.views import AugmentationStrength, make_views
from moco_ref.tools.data import (
    DataError,
    load_dataset,
    load_digits_dataset,
    load_image_folder,
    load_npz,
    stratified_split,
    stratified_subset,
)

# ---- digits -------------------------------------------------------------------------------


def test_digits_are_sklearns_images_scaled_to_unit_range():
    from sklearn.datasets import load_digits

    raw = load_digits()
    digits = load_digits_dataset()
    assert digits.images.shape == (1797, 1, 8, 8) and digits.images.dtype == torch.float32
    assert torch.equal(digits.images[:, 0] * 16, torch.from_numpy(raw.images).float())
    assert digits.labels.tolist() == raw.target.tolist()
    assert load_dataset("digits").name == "digits"


def test_split_is_disjoint_complete_stratified_and_seeded():
    labels = torch.arange(10).repeat_interleave(20)  # 10 classes × 20
    train, held_out = stratified_split(labels, held_out_fraction=0.3, seed=0)
    assert set(train.tolist()).isdisjoint(held_out.tolist())
    assert sorted(train.tolist() + held_out.tolist()) == list(range(200))
    assert torch.bincount(labels[held_out]).tolist() == [6] * 10  # 30% of 20 per class
    again, _ = stratified_split(labels, 0.3, seed=0)
    other, _ = stratified_split(labels, 0.3, seed=1)
    assert torch.equal(train, again) and not torch.equal(train, other)


def test_split_rejects_a_class_with_a_single_image():
    with pytest.raises(DataError, match=r"classes \[2\] have 1"):
        stratified_split(torch.tensor([0, 0, 1, 1, 2]))


def test_subset_keeps_class_proportions():
    labels = torch.tensor([0] * 60 + [1] * 40)
    kept = stratified_subset(labels, 50)
    assert torch.bincount(labels[kept]).tolist() == [30, 20]
    assert torch.equal(stratified_subset(labels, 500), torch.arange(100))


# ---- .npz ---------------------------------------------------------------------------------


def test_npz_uint8_round_trip(tmp_path):
    pixels = np.arange(4 * 5 * 6, dtype=np.uint8).reshape(4, 5, 6)
    path = tmp_path / "data.npz"
    np.savez(path, images=pixels, labels=np.array([3, 1, 3, 1]))
    data = load_npz(path)
    assert data.images.shape == (4, 1, 5, 6)
    assert torch.allclose(data.images[:, 0], torch.from_numpy(pixels / 255.0).float())
    assert data.labels.tolist() == [3, 1, 3, 1] and data.labels.dtype == torch.int64


def test_npz_float_channels_round_trip_through_load_dataset(tmp_path):
    pixels = np.random.default_rng(0).random((3, 3, 4, 4)).astype(np.float32)
    path = tmp_path / "rgb.npz"
    np.savez(path, images=pixels, labels=np.array([0, 1, 0]))
    data = load_dataset(str(path))
    assert torch.equal(data.images, torch.from_numpy(pixels))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"images": np.zeros((2, 4, 4))}, r"missing \['labels'\]"),
        ({"images": np.full((2, 4, 4), 2.0), "labels": np.array([0, 1])}, r"lie in \[0, 1\]"),
        ({"images": np.zeros((2, 4, 4)), "labels": np.array([0, 1, 1])}, "one label per image"),
        ({"images": np.zeros((2, 4, 4)), "labels": np.array([0.0, 1.0])}, "integer array"),
        ({"images": np.zeros((2, 4)), "labels": np.array([0, 1])}, r"\[N, H, W\]"),
        ({"images": np.zeros((2, 4, 4), dtype=np.int32), "labels": np.array([0, 1])}, "uint8"),
    ],
)
def test_malformed_npz_is_rejected_with_the_reason(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message):
        load_npz(path)


def test_missing_or_unreadable_data_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(tmp_path / "nowhere.npz")
    fake = tmp_path / "fake.npz"
    fake.write_text("not a zip archive")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_dataset(fake)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(DataError, match="not a .npz"):
        load_dataset(text)


# ---- image folder and CIFAR-10 root --------------------------------------------------------


def test_image_folder_is_read_resized_and_labelled_by_subfolder(tmp_path):
    from PIL import Image

    colors = {"blue": (0, 0, 255), "red": (255, 0, 0)}
    for name, color in colors.items():
        (tmp_path / name).mkdir()
        for i, size in enumerate([(5, 5), (12, 7)]):
            Image.new("RGB", size, color).save(tmp_path / name / f"{i}.png")
    data = load_dataset(tmp_path, image_size=8)
    assert data.images.shape == (4, 3, 8, 8)
    assert data.labels.tolist() == [0, 0, 1, 1]  # classes sorted: blue, red
    assert torch.allclose(data.images[0].mean(dim=(1, 2)), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.allclose(data.images[3].mean(dim=(1, 2)), torch.tensor([1.0, 0.0, 0.0]))


def test_empty_image_folder_and_missing_cifar_files_are_reported(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not an image folder"):
        load_image_folder(tmp_path / "empty")
    (tmp_path / "cifar" / "cifar-10-batches-py").mkdir(parents=True)
    with pytest.raises(DataError, match="CIFAR-10 files missing or corrupted"):
        load_dataset(tmp_path / "cifar")


# ---- views --------------------------------------------------------------------------------


BATCH = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_views_are_reproducible_from_the_seed_and_successive_calls_differ():
    first, second = make_views(7), make_views(7)
    query_view, key_view = first(BATCH), first(BATCH)
    assert torch.equal(query_view, second(BATCH)) and torch.equal(key_view, second(BATCH))
    assert not torch.equal(query_view, key_view)
    assert not torch.equal(query_view, make_views(8)(BATCH))
    assert query_view.shape == BATCH.shape
    assert float(query_view.min()) >= 0.0 and float(query_view.max()) <= 1.0


def test_each_image_of_a_batch_gets_its_own_transform():
    same_image = BATCH[:1].repeat(6, 1, 1, 1)
    views = make_views(0, strength=AugmentationStrength(noise_sigma=0.0))(same_image)
    assert len({tuple(view.flatten().tolist()) for view in views}) == 6


def test_views_leave_the_global_rng_alone():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    make_views(1)(BATCH)
    assert torch.equal(torch.rand(3), expected)


def test_zero_strength_views_are_the_identity():
    still = AugmentationStrength(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), degrees=0.0,
                                 translate=0.0, noise_sigma=0.0)
    assert torch.allclose(make_views(0, strength=still)(BATCH), BATCH, atol=1e-6)


def test_views_resize_to_the_requested_side():
    assert make_views(0, image_size=16)(BATCH).shape == (6, 1, 16, 16)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: make_views(0)(torch.rand(6, 8, 8)), ValueError, r"\[B, C, H, W\]"),
        (lambda: make_views(0)([[0.0]]), TypeError, "batch must be a torch.Tensor"),
        (lambda: make_views("0"), TypeError, "seed must be an int"),
        (lambda: make_views(0, image_size=0), ValueError, "image_size must be >= 1"),
        (lambda: AugmentationStrength(crop_scale=(0.0, 1.0)), ValueError, "crop_scale"),
        (lambda: AugmentationStrength(degrees=-1.0), ValueError, "degrees"),
        (lambda: AugmentationStrength(noise_sigma=-0.1), ValueError, "noise_sigma"),
    ],
)
def test_bad_view_arguments_are_rejected(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.full  # the second tier: a costly case (CI and tox -e thorough run it)
def test_the_core_and_the_lab_loop_import_without_torchvision():
    blocker = (
        "import sys; sys.modules['torchvision'] = None\n"
        "import moco_ref, moco_ref.core.lab, moco_ref.tools.models, moco_ref.tools.evaluation\n"
        "import moco_ref.tools.data, moco_ref.core.step, moco_ref.core.queue\n"
        "import moco_ref.core.contrastive, moco_ref.core.momentum\n"
        "moco_ref.moco_warmup()\n"  # running the core needs no torchvision either
        "try:\n    import moco_ref.core.views\nexcept ImportError:\n    print('views-needs-tv')\n"
    )
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "views-needs-tv"  # the blocker really blocked
