"""The machine judged, with this session's own runtime RAM where the session runs on it.

A preset carries a figure for what the runtime holds in RAM before the model is built (:mod:`kit.presets` cites
it). Where the machine judged is the one this session runs on, the faces (``kit.check``, the panel, scenario 1)
judge with the runtime this session holds instead, measured (:func:`kit.measure.device.runtime_ram_bytes`); the
prediction itself never measures.

>>> session_preset("l4")   # another machine: the preset's own figure stands
'l4'
"""
from __future__ import annotations

import dataclasses
import sys

from kit import machine
from kit.inputs import InputError
from kit.measure.device import runtime_ram_bytes
from kit.presets import COLAB_VM_RAM_BYTES, resolve_device

HERE = ("this", "cpu")   # the presets that are this machine


def on_colab() -> bool:
    """True inside a Colab runtime (its ``google.colab`` module is loaded)."""
    return "google.colab" in sys.modules


def session_preset(device, measured_bytes: int | None = None):
    """``device``, or where the machine it names is the one this session runs on (``"this"``, the ``"cpu"``
    preset, None with a GPU here, the ``"colab-t4"`` preset inside Colab) a :class:`kit.presets.Preset` carrying
    the runtime RAM measured here (``measured_bytes`` where the caller measured it already; inside Colab the VM's
    own share is added, as the RSS is this process's alone). A device that does not resolve is returned as it
    was, for the face to refuse in its own words."""
    if device is None and not machine.has_cuda():
        return device   # judged against the colab-t4 preset, which this session is not
    try:
        preset, _ = resolve_device(device, cpu_ok=True)
    except InputError:
        return device
    colab = on_colab()
    if preset.name not in HERE and not (colab and preset.name == "colab-t4"):
        return device
    measured = runtime_ram_bytes() if measured_bytes is None else measured_bytes
    return dataclasses.replace(preset, runtime_ram_bytes=measured + (COLAB_VM_RAM_BYTES if colab else 0),
                               runtime_said="measured in this session" + (", with the Colab VM's own" if colab else ""))
