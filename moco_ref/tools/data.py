"""Image data for training and probing: the embedded digits, or the user's own on disk.

Every loader returns a ``LabelledImages``: float32 images ``[N, C, H, W]`` in [0, 1] and int64
labels ``[N]``. Nothing is ever downloaded: the digits ship with scikit-learn, and
torchvision readers are called with ``download=False``.

``load_dataset(source)`` picks the loader: ``None``/``"digits"``, a ``.npz`` file with arrays
``images`` and ``labels``, a CIFAR-10 root (a folder holding ``cifar-10-batches-py``), or an
image folder in torchvision's ``ImageFolder`` layout (one sub-folder per class).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from moco_ref.core.validation import require_count

CIFAR10_FOLDER = "cifar-10-batches-py"


class DataError(ValueError):
    """The data given cannot be used; the message says what is wrong and where."""


@dataclass(frozen=True)
class LabelledImages:
    images: torch.Tensor  # [N, C, H, W] float32 in [0, 1]
    labels: torch.Tensor  # [N] int64
    name: str

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.dtype != torch.float32:
            raise DataError(
                f"{self.name}: images must be float32 [N, C, H, W], "
                f"got {self.images.dtype} {list(self.images.shape)}"
            )
        if self.labels.ndim != 1 or len(self.labels) != len(self.images):
            raise DataError(
                f"{self.name}: need one label per image, got {len(self.images)} images and "
                f"labels of shape {list(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        return self.images.shape[-1]

    def subset(self, indices: torch.Tensor) -> LabelledImages:
        return LabelledImages(self.images[indices], self.labels[indices], self.name)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "items": len(self),
            "image_shape": list(self.images.shape[1:]),
            "classes": int(len(torch.unique(self.labels))),
        }


def load_digits_dataset() -> LabelledImages:
    """scikit-learn's bundled 8×8 handwritten digits: ``[1797, 1, 8, 8]``, 10 classes."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images / 16.0).to(torch.float32)[:, None]  # [N, 1, 8, 8]
    labels = torch.from_numpy(digits.target).to(torch.int64)  # [N]
    return LabelledImages(images, labels, "digits")


def load_npz(path: str | Path) -> LabelledImages:
    """An ``.npz`` with ``images`` (``[N, H, W]`` or ``[N, C, H, W]``; uint8 in 0…255 or floats in
    [0, 1]) and integer ``labels`` ``[N]``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: no such file {str(path)!r}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            found = sorted(archive.files)
            arrays = {name: archive[name] for name in ("images", "labels") if name in found}
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable .npz archive ({error})") from None
    missing = sorted({"images", "labels"} - set(arrays))
    if missing:
        raise DataError(
            f"{path}: the .npz must hold arrays 'images' and 'labels'; missing {missing}, "
            f"found {found}"
        )
    images, labels = arrays["images"], arrays["labels"]
    return LabelledImages(_images_from_array(images, path), _labels_from_array(labels, path),
                          path.name)


def load_image_folder(root: str | Path, image_size: int = 32) -> LabelledImages:
    """torchvision ``ImageFolder`` layout (``root/<class>/<image>``), every image converted to
    RGB and resized to ``image_size × image_size``."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    root = _existing_folder(root)
    image_size = require_count("image_size", image_size)
    to_tensor = v2.Compose([
        v2.ToImage(),
        v2.Resize([image_size, image_size], antialias=True),
        v2.ToDtype(torch.float32, scale=True),
    ])
    try:
        folder = ImageFolder(str(root), transform=to_tensor, loader=_rgb_loader)
    except (FileNotFoundError, RuntimeError) as error:
        raise DataError(f"{root}: not an image folder with one sub-folder per class ({error})") \
            from None
    images, labels = _stack(folder, root)
    return LabelledImages(images, labels, root.name)


def load_cifar10(root: str | Path) -> LabelledImages:
    """The CIFAR-10 training set under ``root`` (already on disk; never downloaded)."""
    from torchvision.datasets import CIFAR10

    root = _existing_folder(root)
    if root.name == CIFAR10_FOLDER:
        root = root.parent
    try:
        cifar = CIFAR10(str(root), train=True, download=False)
    except RuntimeError as error:
        raise DataError(f"{root}: CIFAR-10 files missing or corrupted ({error})") from None
    images = torch.from_numpy(cifar.data).permute(0, 3, 1, 2).float() / 255.0  # [N, 3, 32, 32]
    labels = torch.as_tensor(cifar.targets, dtype=torch.int64)
    return LabelledImages(images.contiguous(), labels, "cifar10")


def load_dataset(source: str | Path | None = None, *, image_size: int = 32) -> LabelledImages:
    """The digits when ``source`` is ``None`` or ``"digits"``; otherwise the file or folder."""
    if source is None or str(source) == "digits":
        return load_digits_dataset()
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"--data: {str(path)!r} does not exist (give a .npz file, an image folder, "
            "a CIFAR-10 root, or 'digits')"
        )
    if path.is_file():
        if path.suffix != ".npz":
            raise DataError(f"--data: {str(path)!r} is a file but not a .npz archive")
        return load_npz(path)
    if path.name == CIFAR10_FOLDER or (path / CIFAR10_FOLDER).is_dir():
        return load_cifar10(path)
    return load_image_folder(path, image_size=image_size)


def stratified_split(
    labels: torch.Tensor, held_out_fraction: float = 0.3, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(train [N_train], held_out [N_held])``, sorted, each class split in the same
    proportion; the same seed gives the same split."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must lie in (0, 1), got {held_out_fraction}")
    labels_np = labels.numpy()
    classes, counts = np.unique(labels_np, return_counts=True)
    if len(classes) < 2:
        raise DataError(f"need at least 2 classes to probe, got {len(classes)}")
    if counts.min() < 2:
        rare = classes[counts < 2].tolist()
        raise DataError(f"every class needs at least 2 images to split, classes {rare} have 1")
    try:
        train, held_out = train_test_split(
            np.arange(len(labels_np)), test_size=held_out_fraction, random_state=seed,
            stratify=labels_np,
        )
    except ValueError as error:
        raise DataError(f"cannot split {len(labels_np)} images stratified: {error}") from None
    return torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(held_out))


def stratified_subset(labels: torch.Tensor, limit: int, seed: int = 0) -> torch.Tensor:
    """At most ``limit`` indices, sorted, keeping the class proportions (all when fewer)."""
    limit = require_count("limit", limit)
    if limit >= len(labels):
        return torch.arange(len(labels))
    kept, _ = stratified_split(labels, held_out_fraction=1.0 - limit / len(labels), seed=seed)
    return kept


def _images_from_array(images: np.ndarray, path: Path) -> torch.Tensor:
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4 or images.shape[0] == 0:
        raise DataError(
            f"{path}: 'images' must have shape [N, H, W] or [N, C, H, W] with N > 0, "
            f"got {list(images.shape)}"
        )
    if images.dtype == np.uint8:
        return torch.from_numpy(images.astype(np.float32) / 255.0)
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"{path}: 'images' must be uint8 (0…255) or float in [0, 1], "
                        f"got dtype {images.dtype}")
    if not np.isfinite(images).all() or images.min() < 0.0 or images.max() > 1.0:
        raise DataError(
            f"{path}: float 'images' must be finite and lie in [0, 1], got range "
            f"[{np.nanmin(images):.3g}, {np.nanmax(images):.3g}]"
        )
    return torch.from_numpy(images.astype(np.float32))


def _labels_from_array(labels: np.ndarray, path: Path) -> torch.Tensor:
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{path}: 'labels' must be a 1-d integer array, got {labels.dtype} {list(labels.shape)}"
        )
    return torch.from_numpy(labels.astype(np.int64))


def _existing_folder(root: str | Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--data: no such folder {str(root)!r}")
    return root


def _rgb_loader(path: str):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def _stack(folder, root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    if len(folder) == 0:
        raise DataError(f"{root}: the image folder holds no images")
    images, labels = [], []
    for index in range(len(folder)):
        try:
            image, label = folder[index]
        except OSError as error:
            raise DataError(f"{folder.samples[index][0]}: cannot read image ({error})") from None
        images.append(image)
        labels.append(label)
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64)
