"""A tracker on disk: ``Tracker.to_csv`` / ``Tracker.load`` (JSON and CSV), one row per reading.

>>> t = Tracker()                                             # doctest: +SKIP
>>> t.to_csv("run.csv"); Tracker.load("run.csv")              # doctest: +SKIP
"""
from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

from kit.measure.device import Snapshot
from kit.measure.records import STAGE_FIELDS, Sample, StageRecord

_SNAP_FIELDS = [f.name for f in fields(Snapshot) if f.name != "live_tensor_bytes"]


def write_csv(tracker, path: str | Path) -> None:
    """One row per reading (``kind`` = stage_start, stage_end or sample); stage peaks on stage_end rows."""
    devs = sorted({d for r in tracker.records for s in (r.start, r.end) if s for d in s.live_tensor_bytes or {}}
                  | {d for s in tracker.samples for d in s.snap.live_tensor_bytes or {}})
    rows = []
    for r in tracker.records:
        base = {"stage": r.name, "stage_index": r.index, "order": r.order, "depth": r.depth}
        rows.append({"kind": "stage_start", **base, "has_live": r.start.live_tensor_bytes is not None,
                     **_flat(r.start, devs)})
        if r.end is not None:
            peaks = {f"stage_{k}": getattr(r, k) for k in STAGE_FIELDS}
            peaks.update({f"stage_live_peak_{d}_bytes": r.live_peak_bytes.get(d) for d in devs})
            rows.append({"kind": "stage_end", **base, "has_live": r.end.live_tensor_bytes is not None,
                         **_flat(r.end, devs), **peaks})
    for s in tracker.samples:
        rows.append({"kind": "sample", "stage": s.stage, "stage_index": s.stage_index, "step": s.step,
                     "event": s.event, "has_live": s.has_live, "cost_s": s.cost_s, **_flat(s.snap, devs)})
    rows.sort(key=lambda row: row["time"])
    cols = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def load(tracker, path: Path):
    """Fill the empty tracker ``tracker`` from a file written by ``Tracker.to_json`` or ``Tracker.to_csv``."""
    if path.suffix == ".json":
        d = json.loads(path.read_text())
        if d.get("kit") != "track":
            raise ValueError(f"{path} is not a kit tracker file (no 'kit': 'track' field)")
        tracker.device, tracker.reading = d["device"], d["reading"]
        tracker.records = [StageRecord.from_dict(r) for r in d["stages"]]
        tracker.samples = [Sample.from_dict(s) for s in d["samples"]]
    elif path.suffix == ".csv":
        _load_csv(tracker, path)
    else:
        raise ValueError(f"Tracker.load reads .json or .csv files, not {path.name!r}")
    for r in tracker.records:
        tracker._counts[r.name] = max(tracker._counts.get(r.name, 0), r.index + 1)
    if tracker.records and tracker.records[0].on_cuda:
        tracker.device, tracker.reading = "cuda", "cuda_allocated"
    return tracker


def _flat(snap: Snapshot, devs: list[str]) -> dict:
    d = {k: getattr(snap, k) for k in _SNAP_FIELDS}
    d.update({f"live_{dev}_bytes": (snap.live_tensor_bytes or {}).get(dev) for dev in devs})
    return d


def _parse(key: str, text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if key.endswith("_bytes") or key in ("stage_index", "order", "depth", "step"):
        return int(text)
    if key in ("time", "cost_s"):
        return float(text)
    return text


def _load_csv(tracker, path: Path) -> None:
    with open(path, newline="") as f:
        rows = [{k: _parse(k, v) for k, v in row.items()} for row in csv.DictReader(f)]
    open_recs: dict[int, StageRecord] = {}
    for row in rows:
        snap = Snapshot(**{k: row.get(k) for k in _SNAP_FIELDS})
        if row["has_live"]:
            snap.live_tensor_bytes = {k[5:-6]: v for k, v in row.items()
                                      if k.startswith("live_") and k.endswith("_bytes") and v is not None}
        if row["kind"] == "sample":
            tracker.samples.append(Sample(snap, row["step"], row["event"], row["stage"], row["stage_index"],
                                          bool(row["has_live"]), row["cost_s"] or 0.0))
        elif row["kind"] == "stage_start":
            open_recs[row["order"]] = StageRecord(name=row["stage"], index=row["stage_index"], order=row["order"],
                                                  start=snap,
                                                  depth=row["depth"])
        else:
            r = open_recs.pop(row["order"])
            r.end = snap
            for k in STAGE_FIELDS:
                setattr(r, k, row.get(f"stage_{k}"))
            r.reset_peak, r.live_peak_exact = bool(r.reset_peak), bool(r.live_peak_exact)
            r.peak_note = r.peak_note or ""
            r.live_peak_bytes = {k[16:-6]: v for k, v in row.items()
                                 if k.startswith("stage_live_peak_") and k.endswith("_bytes") and v is not None}
            tracker.records.append(r)
    tracker.records += list(open_recs.values())
    tracker.records.sort(key=lambda record: record.order)
