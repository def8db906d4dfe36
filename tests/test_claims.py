"""Takeaways written from the numbers: each recorded, and the course report lists those that did not hold."""

from __future__ import annotations

from pathlib import Path

import kvlab
from kvlab.course import build
from kvlab.runtime.claims import read_claims


def test_a_claim_says_what_happened_and_is_recorded(tmp_path, monkeypatch, capsys):
    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("KVLAB_CLAIMS_LOG", str(log))
    assert kvlab.claim(True, "TTFT rose", "TTFT fell") == "TTFT rose"
    assert kvlab.claim(False, "throughput rose", "throughput fell", show=True) == "throughput fell"
    assert capsys.readouterr().out == "throughput fell\n"
    assert [c["held"] for c in read_claims(log)] == [True, False]
    kvlab.claim(False, "of the 0 of 4 that met it", "none met it", teaches="at least one meets the SLO")
    assert read_claims(log)[-1]["claim"] == "at least one meets the SLO"  # the report's words, not "0 of 4"
    assert read_claims(tmp_path / "none.jsonl") == []


def test_the_report_lists_the_takeaways_that_did_not_hold(tmp_path):
    missing = Path(tmp_path / "none.ipynb")
    held = {"claim": "TTFT rose", "held": True, "instead": "TTFT fell"}
    missed = {"claim": "throughput rose", "held": False, "instead": "throughput fell from 95 to 77 tok/s"}
    runs = [build.NotebookRun("04_chunked_prefill", "04", True, 60.0, missing, None, claims=[held, missed]),
            build.NotebookRun("05_batching", "05", True, 60.0, missing, None, claims=[held])]
    report = build.write_index(runs, tmp_path).read_text()
    assert "1 of 2 takeaways held" in report and "1 of 1 takeaways held" in report
    assert "<b>Machine:</b>" in report and "model dtype" in report  # named at the top
    listed = report.split("Takeaways that did not hold on this build", 1)[1]
    assert "throughput fell from 95 to 77 tok/s" in listed and "TTFT fell" not in listed
    runs[0].claims = [held]
    assert "Every takeaway the lessons state from their numbers held" in build.write_index(runs, tmp_path).read_text()


def test_reference_lesson_times_cover_every_lesson_and_sit_beside_a_full_build(tmp_path, monkeypatch):
    lessons = {p.stem for p in build.lessons()}
    references = build.reference_times()
    for name, times in references.items():
        assert set(times) <= lessons and all(t > 0 for t in times.values()), (name, set(times) - lessons)
    for dtype in ("bfloat16", "float32"):  # every lesson timed in both dtypes (an older machine's rows may lack one)
        assert any(f", {dtype} (" in name and set(times) == lessons for name, times in references.items()), dtype
    runs = [build.NotebookRun("05_batching", "05", True, 60.0, Path(tmp_path / "none.ipynb"), None)]
    monkeypatch.delenv("KVLAB_QUICK", raising=False)
    full = build.write_index(runs, tmp_path).read_text()
    first = next(iter(references))
    assert f"reference: {first}" in full and f"<td>{references[first]['05_batching']:.0f} s</td>" in full
    monkeypatch.setenv("KVLAB_QUICK", "1")
    assert "<th>reference:" not in build.write_index(runs, tmp_path).read_text()  # quick-mode times are not comparable
