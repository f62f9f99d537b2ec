"""Small encoders with the `base_encoder(num_classes=dim)` interface of torchvision models."""

from torch import nn


class TinyConvNet(nn.Module):
    """conv → (BN) → ReLU → pool → fc; `.fc` is the last Linear, as in ResNets."""

    def __init__(self, num_classes=16, batch_norm=True, width=8):
        super().__init__()
        layers = [nn.Conv2d(3, width, 3, padding=1)]
        layers += [nn.BatchNorm2d(width)] if batch_norm else []
        layers += [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(self.body(x))


def tiny_without_bn(num_classes=16):
    return TinyConvNet(num_classes, batch_norm=False)
