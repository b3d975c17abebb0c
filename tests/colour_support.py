"""Colour distances as people with each common colour-vision deficiency see them.

Simulation: Machado, Oliveira & Fernandes (2009), severity 1 (protanopia, deuteranopia,
tritanopia), applied in linear sRGB; distance: CIE76 ΔE in CIELAB (D65). A ΔE of 10 is
plainly visible side by side.
"""

from __future__ import annotations

import itertools

import numpy as np

VISIONS = {
    "normal": np.eye(3),
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                            [0.004733, 0.691367, 0.303900]]),
}
SRGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                        [0.0193, 0.1192, 0.9505]])
WHITE = np.array([0.95047, 1.0, 1.08883])


def linear_rgb(color: str) -> np.ndarray:
    """``#rrggbb`` as linear sRGB in [0, 1]."""
    c = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def lab(color: str, vision: str = "normal") -> np.ndarray:
    t = SRGB_TO_XYZ @ np.clip(VISIONS[vision] @ linear_rgb(color), 0, 1) / WHITE
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def closest_pair(colors) -> tuple[float, str, str, str]:
    """(ΔE, vision, a, b): the least distinct pair of ``colors`` in any vision."""
    return min((float(np.linalg.norm(lab(a, v) - lab(b, v))), v, a, b)
               for v in VISIONS for a, b in itertools.combinations(colors, 2))


def contrast(foreground: str, background: str) -> float:
    """WCAG 2 contrast ratio of two colours."""
    def luminance(color: str) -> float:
        return float(np.array([0.2126, 0.7152, 0.0722]) @ linear_rgb(color))

    hi, lo = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
