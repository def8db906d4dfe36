"""A lesson's takeaways, written from its own numbers: each sentence that states an outcome is chosen by what this run
measured, and recorded, so that the course report lists the takeaways that did not hold on this machine."""

from __future__ import annotations

import json
import os


def claim(holds: bool, said: str, otherwise: str, show: bool = False, teaches: str | None = None) -> str:
    """``said`` when ``holds`` (the outcome the lesson teaches), else ``otherwise`` (what this run showed instead);
    recorded in ``KVLAB_CLAIMS_LOG`` when set (the course build sets it per lesson), with ``teaches`` — the takeaway
    in words, for the report, where ``said`` carries numbers that read wrongly when it failed ("saves -1 blocks").
    Printed when ``show``."""
    sentence = said if holds else otherwise
    path = os.environ.get("KVLAB_CLAIMS_LOG", "").strip()
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"claim": teaches or said, "held": bool(holds), "instead": otherwise}) + "\n")
    if show:
        print(sentence)
    return sentence


def read_claims(path: str | os.PathLike[str]) -> list[dict]:
    """The claims a lesson recorded (``claim``), in order; none when it wrote no log."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
