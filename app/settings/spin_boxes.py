"""The number fields the settings dialogs share."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox


def double_box(low: float, high: float, step: float, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(2)
    box.setValue(value)
    return box


def int_box(low: int, high: int, value: int, special: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    if special:
        box.setSpecialValueText(special)  # shown at the minimum
    return box
