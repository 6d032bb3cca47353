"""Hardware for the planner: a bundled catalogue and a one-line spec for anything else.

A :class:`~verispec.plan.device.Hardware` is the roofline's two ceilings per device -
memory bandwidth (bytes/s) and peak FLOP/s - plus device memory, the number of devices
a model is split over (tensor parallel), the link bandwidth their all-reduces use, and
the kind of processor (GPU, Apple silicon, CPU, TPU) with its widest vector unit.

The catalogue (``hardware.csv`` beside this file) holds vendor figures, each row with
its source: datacenter GPUs and TPUs; RTX 30/40/50 cards (bandwidth from memory clock
and bus width, fp16 tensor throughput with fp32 accumulate = SMs x boost x 512
FLOP/clock, as NVIDIA's whitepapers tabulate it); Apple M1-M4 base/Pro/Max/Ultra
(Apple's bandwidth, GPU fp32 TFLOPS); desktop and server CPUs (bandwidth = channels x
MT/s x 8 bytes, fp32 FMA peak at base clock). ``--hardware`` accepts:

* a catalogue name or alias, exactly (case, spaces and punctuation ignored):
  ``"H100 SXM5"``, ``h100``, ``"Apple M1"``, ``m1``, ``m4-max``, ``rtx4090``; optionally
  ``2xh100`` / ``h100x2`` or followed by overrides: ``"h100,n=2"``. Anything else is an
  error with "did you mean ..." - never a prefix match (``m1`` is the M1, not the M1
  Ultra; ``rtx30`` names a family, so it is refused as ambiguous);
* a spec: ``"bw=2039GB/s,flops=312T,mem=80GB,n=2,link=600GB/s,name=my-box"`` (``bw`` and
  ``flops`` required; plain numbers mean GB/s, TFLOP/s and GB);
* ``local``: this machine, measured (:func:`verispec.plan.local.local_hardware`).
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from typing import Any

from .device import Hardware
from .local import local_hardware

__all__ = ["Hardware", "catalogue", "lookup", "parse_hardware", "parse_quantity"]


_UNITS = {
    "bandwidth": ({"": 1e9, "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
                   "kib/s": 2.0**10, "mib/s": 2.0**20, "gib/s": 2.0**30, "tib/s": 2.0**40,
                   "gbps": 1e9 / 8, "g": 1e9, "t": 1e12, "gb": 1e9, "tb": 1e12}, "GB/s"),
    "flops": ({"": 1e12, "flops": 1.0, "flop/s": 1.0, "g": 1e9, "gflops": 1e9, "gflop/s": 1e9,
               "t": 1e12, "tflops": 1e12, "tflop/s": 1e12, "p": 1e15, "pflops": 1e15, "pflop/s": 1e15}, "TFLOP/s"),
    "memory": ({"": 1e9, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "g": 1e9, "t": 1e12,
                "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40}, "GB"),
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]*)\s*$", re.IGNORECASE)


def parse_quantity(text: str, kind: str, flag: str = "--hardware") -> float:
    """``"2039GB/s"`` → 2.039e12 (kind "bandwidth"), ``"312T"`` → 3.12e14 ("flops"),
    ``"80GB"`` → 8e10 ("memory"). A bare number takes the default unit (GB/s, TFLOP/s, GB).

    Raises:
        ValueError: naming ``flag``, the quantity and the accepted units.
    """
    units, default = _UNITS[kind]
    m = _QUANTITY.match(str(text))
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"{flag}: cannot read {kind} {text!r}; write e.g. 2039GB/s, 312T or 80GB "
                         f"(a bare number means {default})")
    value = float(m.group(1)) * units[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{flag}: {kind} must be > 0, got {text!r}")
    return value


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@lru_cache(maxsize=1)
def _rows() -> tuple[dict[str, str], ...]:
    text = resources.files(__package__).joinpath("hardware.csv").read_text(encoding="utf-8")
    return tuple(csv.DictReader(text.splitlines()))


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Hardware]:
    """The bundled catalogue: {name: Hardware} (one device each), read from hardware.csv."""
    out: dict[str, Hardware] = {}
    for row in _rows():
        flops = row["peak_tflops"].strip()
        link = row["interconnect_gb_s"].strip()
        out[row["name"]] = Hardware(
            name=row["name"], bandwidth=float(row["memory_bandwidth_gb_s"]) * 1e9,
            flops=float(flops) * 1e12 if flops else None,
            memory=float(row["memory_gb"]) * 1e9 if row["memory_gb"].strip() else None,
            link_bandwidth=float(link) * 1e9 if link else None, kind=row["kind"], vector=row["vector"],
            source=row["source"] + (f"; {row['notes']}" if row["notes"].strip() else ""))
    return out


@lru_cache(maxsize=1)
def _aliases() -> dict[str, str]:
    """{normalised name or alias: catalogue name}; an alias naming two entries is a bug."""
    out: dict[str, str] = {}
    for row in _rows():
        names = [row["name"], *(a for a in row["aliases"].split(";") if a.strip())]
        if row["name"].startswith("Apple "):
            names.append(row["name"][len("Apple "):])
        if row["kind"] == "gpu" and row["name"].startswith("RTX "):
            names.append("GeForce " + row["name"])
        for alias in names:
            key = _key(alias)
            if out.get(key, row["name"]) != row["name"]:
                raise RuntimeError(f"hardware.csv: alias {alias!r} names {out[key]} and {row['name']}")
            out[key] = row["name"]
    return out


def lookup(name: str, flag: str = "--hardware") -> Hardware:
    """A catalogue entry by its exact name or alias (case, spaces and punctuation ignored).

    Never a prefix match: ``m1`` is the Apple M1 (an alias), and a family such as
    ``rtx30`` or ``m3`` followed by nothing it names is an error listing the members.

    Raises:
        ValueError: naming ``flag``; "ambiguous" with the entries when ``name`` is the
            start of several, else "unknown hardware" with "did you mean ..." (close
            spellings, ``difflib``) and the other ways to describe a machine.
    """
    key = _key(name)
    aliases = _aliases()
    if key in aliases:
        return catalogue()[aliases[key]]
    family = sorted({full for alias, full in aliases.items() if key and alias.startswith(key)},
                    key=list(catalogue()).index)
    if len(family) > 1:
        raise ValueError(f"{flag}: {name!r} is ambiguous; did you mean one of: {', '.join(family)}?")
    close = difflib.get_close_matches(key, list(aliases), n=6, cutoff=0.6)
    guesses = list(dict.fromkeys(family + [aliases[c] for c in close]))
    hint = f"did you mean {' or '.join(repr(g) for g in guesses[:4])}? " if guesses else ""
    raise ValueError(f"{flag}: unknown hardware {name!r}; {hint}Write a catalogue name "
                     f"(`verispec plan --list-hardware`), a spec like 'bw=2039GB/s,flops=312T,mem=80GB,n=2', "
                     f"or 'local'")


_KEYS = {"bw": "bandwidth", "bandwidth": "bandwidth", "flops": "flops", "peak": "flops",
         "mem": "memory", "memory": "memory", "n": "n_devices", "devices": "n_devices",
         "link": "link_bandwidth", "interconnect": "link_bandwidth", "name": "name"}


def parse_hardware(spec: str | Hardware, flag: str = "--hardware") -> Hardware:
    """Parse a ``--hardware`` value (see the module doc); ``local`` is measured.

    Raises:
        ValueError: naming ``flag`` for an unknown name, an unknown key, an unreadable
            quantity, a missing ``bw``/``flops`` in a spec, or n < 1.
    """
    if isinstance(spec, Hardware):
        return spec
    text = str(spec).strip()
    if not text:
        raise ValueError(f"{flag}: empty hardware spec")
    if text.lower() == "local":
        return local_hardware()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    base: Hardware | None = None
    if "=" not in parts[0]:
        name, count = parts[0], None
        m = re.fullmatch(r"(\d+)\s*[x×]\s*(.+)", name, re.IGNORECASE) or None
        if m:
            count, name = int(m.group(1)), m.group(2)
        else:
            m = re.fullmatch(r"(.+?)\s*[x×]\s*(\d+)", name, re.IGNORECASE)
            if m and _key(m.group(1)) in _aliases():
                name, count = m.group(1), int(m.group(2))
        base = lookup(name, flag)
        if count is not None:
            base = replace(base, n_devices=count)
        parts = parts[1:]
    fields: dict[str, Any] = {}
    for part in parts:
        if "=" not in part:
            raise ValueError(f"{flag}: expected key=value, got {part!r} (keys: bw, flops, mem, n, link, name)")
        k, v = (s.strip() for s in part.split("=", 1))
        field = _KEYS.get(k.lower())
        if field is None:
            raise ValueError(f"{flag}: unknown key {k!r} (keys: bw, flops, mem, n, link, name)")
        if field == "name":
            fields[field] = v
        elif field == "n_devices":
            if not re.fullmatch(r"\d+", v) or int(v) < 1:
                raise ValueError(f"{flag}: n must be an integer >= 1, got {v!r}")
            fields[field] = int(v)
        else:
            kind = "bandwidth" if field in ("bandwidth", "link_bandwidth") else field
            fields[field] = parse_quantity(v, kind, flag)
    if base is not None:
        return replace(base, **fields)
    missing = [k for k, f in (("bw", "bandwidth"), ("flops", "flops")) if f not in fields]
    if missing:
        raise ValueError(f"{flag}: a spec needs {' and '.join(missing)} (e.g. 'bw=2039GB/s,flops=312T'), "
                         "or name a catalogue entry (`verispec plan --list-hardware`)")
    fields.setdefault("name", "custom")
    fields.setdefault("source", f"{flag} {text}")
    return Hardware(**fields)
